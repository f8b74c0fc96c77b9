// INFERD_CHECK: invariant checks that stay on in release builds and name the broken invariant.
#pragma once

#include <cstdio>
#include <cstdlib>

#define INFERD_CHECK(cond, what)                                                                   \
  do {                                                                                             \
    if (!(cond)) [[unlikely]] {                                                                    \
      std::fprintf(stderr, "%s:%d: invariant broken: %s (%s)\n", __FILE__, __LINE__, what, #cond); \
      std::abort();                                                                                \
    }                                                                                              \
  } while (0)
