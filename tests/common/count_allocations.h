// Counts C++ heap allocations while g_counting is set, for tests that a warm training step
// allocates nothing. It REPLACES the global operator new and delete, so it is included by exactly
// one source file of a test executable.
#pragma once

#include <atomic>
#include <cstdlib>
#include <new>

// GCC's new/delete pairing analysis cannot see that the replacements match.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

static std::atomic<bool> g_counting{false};
static std::atomic<long> g_allocations{0};

void* operator new(size_t n) {
  if (g_counting) ++g_allocations;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
