// Process-wide allocator settings for Cloister's own daemons (cloisterd, cloister-enclave).
//
// Every inference request crosses each process as a few buffers of its ciphertext or plaintext
// size (a batch of 16 images is 1.8 MB). With glibc's defaults a buffer of that size is either
// mapped and unmapped on every request or returned to the kernel when the heap is trimmed, so
// each request pays a page fault and a kernel zeroing per 4 KiB page, several times over: on a
// 2-core machine that was about a fifth of the appliance's per-request cost. Keeping freed
// buffers in the heap lets the next request reuse them warm.
//
// Not for libraries (the SDK leaves its host application's allocator alone).
#pragma once

#include <cstddef>

namespace cloister {

// Buffers up to this size come from the heap, not from their own mapping.
inline constexpr size_t kHeapBufferLimit = size_t{32} << 20;
// Freed memory kept at the top of a heap before it is returned to the kernel.
inline constexpr size_t kHeapKeepLimit = size_t{256} << 20;

// Applies the two limits above (mallopt M_MMAP_THRESHOLD and M_TRIM_THRESHOLD). Call first in
// main(), before threads start. Environment settings (GLIBC_TUNABLES, MALLOC_*_) win: when
// either is set for this process, nothing is changed. Returns whether the limits were applied.
bool KeepFreedBuffersForReuse();

}  // namespace cloister
