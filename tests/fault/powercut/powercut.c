/* A power cut for one directory, as an LD_PRELOAD library: it keeps, beside POWERCUT_DIR, a copy
 * of what a real power cut would leave there (POWERCUT_DIR.durable): a file's content as of its
 * last fsync or fdatasync. Renames and unlinks under the directory are applied to the copy too
 * (a rename of a file never synced leaves the copy as it was). The process writes and reads the
 * real directory as ever, so the real RocksDB and file code run unchanged; a test that SIGKILLs
 * the process and puts the copy in the directory's place sees what the disk would hold after
 * the power came back. Only what the process syncs through these calls counts: sync_file_range
 * and O_DIRECT writes are not durable here (neither is used by the code under test). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_rename)(const char *, const char *);
static int (*real_renameat)(int, const char *, int, const char *);
static int (*real_unlink)(const char *);
static int (*real_unlinkat)(int, const char *, int);

__attribute__((constructor)) static void bind_real(void) {
  real_fsync = dlsym(RTLD_NEXT, "fsync");
  real_fdatasync = dlsym(RTLD_NEXT, "fdatasync");
  real_rename = dlsym(RTLD_NEXT, "rename");
  real_renameat = dlsym(RTLD_NEXT, "renameat");
  real_unlink = dlsym(RTLD_NEXT, "unlink");
  real_unlinkat = dlsym(RTLD_NEXT, "unlinkat");
}

/* The part of an absolute path under POWERCUT_DIR ("/x/y"), or NULL when outside it. */
static const char *under(const char *path) {
  const char *dir = getenv("POWERCUT_DIR");
  size_t n = dir ? strlen(dir) : 0;
  if (n == 0 || strncmp(path, dir, n) != 0 || path[n] != '/') return NULL;
  return path + n;
}

static int shadow_of(const char *rel, char *out) {
  return snprintf(out, PATH_MAX, "%s.durable%s", getenv("POWERCUT_DIR"), rel) < PATH_MAX;
}

/* ``path`` made absolute against ``dirfd`` (AT_FDCWD: the working directory). */
static int absolute(int dirfd, const char *path, char *out) {
  char base[PATH_MAX], link[64];
  if (path[0] == '/') return snprintf(out, PATH_MAX, "%s", path) < PATH_MAX;
  if (dirfd == AT_FDCWD) {
    if (!getcwd(base, sizeof base)) return 0;
  } else {
    snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
    ssize_t got = readlink(link, base, sizeof base - 1);
    if (got < 0) return 0;
    base[got] = '\0';
  }
  return snprintf(out, PATH_MAX, "%s/%s", base, path) < PATH_MAX;
}

static void make_parents(char *path) {
  for (char *p = path + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    mkdir(path, 0700);
    *p = '/';
  }
}

/* Copy the file open as ``fd`` into the durable copy, whole, replacing what was there. */
static void keep(int fd) {
  char link[64], path[PATH_MAX], dst[PATH_MAX], tmp[PATH_MAX + 8];
  struct stat st;
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t got = readlink(link, path, sizeof path - 1);
  if (got < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return;
  path[got] = '\0';
  const char *rel = under(path);
  if (!rel || !shadow_of(rel, dst)) return;
  snprintf(tmp, sizeof tmp, "%s.pc-tmp", dst);
  pthread_mutex_lock(&lock);
  make_parents(dst);
  int in = open(path, O_RDONLY), out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (in >= 0 && out >= 0) {
    char buf[1 << 16];
    ssize_t n;
    while ((n = read(in, buf, sizeof buf)) > 0)
      if (write(out, buf, (size_t)n) != n) break;
    real_rename(tmp, dst);
  }
  if (in >= 0) close(in);
  if (out >= 0) close(out);
  pthread_mutex_unlock(&lock);
}

int fsync(int fd) {
  int rc = real_fsync(fd);
  if (rc == 0) keep(fd);
  return rc;
}

int fdatasync(int fd) {
  int rc = real_fdatasync(fd);
  if (rc == 0) keep(fd);
  return rc;
}

static void moved(int olddir, const char *old, int newdir, const char *new_) {
  char a[PATH_MAX], b[PATH_MAX], sa[PATH_MAX], sb[PATH_MAX];
  if (!absolute(olddir, old, a) || !absolute(newdir, new_, b)) return;
  const char *ra = under(a), *rb = under(b);
  if (!ra || !rb || !shadow_of(ra, sa) || !shadow_of(rb, sb)) return;
  pthread_mutex_lock(&lock);
  if (access(sa, F_OK) == 0) {
    make_parents(sb);
    real_rename(sa, sb);
  }
  pthread_mutex_unlock(&lock);
}

static void removed(int dirfd, const char *path) {
  char a[PATH_MAX], sa[PATH_MAX];
  const char *ra;
  if (!absolute(dirfd, path, a) || !(ra = under(a)) || !shadow_of(ra, sa)) return;
  pthread_mutex_lock(&lock);
  real_unlink(sa);
  pthread_mutex_unlock(&lock);
}

int rename(const char *old, const char *new_) {
  int rc = real_rename(old, new_);
  if (rc == 0) moved(AT_FDCWD, old, AT_FDCWD, new_);
  return rc;
}

int renameat(int olddir, const char *old, int newdir, const char *new_) {
  int rc = real_renameat(olddir, old, newdir, new_);
  if (rc == 0) moved(olddir, old, newdir, new_);
  return rc;
}

int unlink(const char *path) {
  int rc = real_unlink(path);
  if (rc == 0) removed(AT_FDCWD, path);
  return rc;
}

int unlinkat(int dirfd, const char *path, int flags) {
  int rc = real_unlinkat(dirfd, path, flags);
  if (rc == 0 && !(flags & AT_REMOVEDIR)) removed(dirfd, path);
  return rc;
}
