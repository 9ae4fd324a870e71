#include "master.h"
int gc_master_start(gcache *c, const char *masters, char *error, size_t error_len)
{
    (void)c; (void)masters; (void)error; (void)error_len;
    return GCACHE_ERR_INVALID;
}
void gc_master_stop(gc_master *m) { (void)m; }
