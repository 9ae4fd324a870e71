/* xxh3_64 (seed 0), the checksum of every value and the ring's hash, from Debian's libxxhash
 * through its runtime CPU dispatch (AVX2 or AVX-512 where the CPU has them). The packaged
 * library's plain XXH3 entry points are its generic build: 7.7 GB/s against 30.6 dispatched
 * for a 4 MiB value on this machine's CPUs, and every put and every TCP read hashes its whole
 * value, so this decides their speed. The state type is public for stack allocation. */
#ifndef GC_XXH_H
#define GC_XXH_H

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xxh_x86dispatch.h>
#endif

#endif
