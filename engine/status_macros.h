// Early-return helpers for absl::Status / absl::StatusOr.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define INFERD_CONCAT_INNER(a, b) a##b
#define INFERD_CONCAT(a, b) INFERD_CONCAT_INNER(a, b)

#define INFERD_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::absl::Status inferd_status_ = (expr);          \
    if (!inferd_status_.ok()) return inferd_status_; \
  } while (0)

#define INFERD_ASSIGN_OR_RETURN(lhs, expr) INFERD_ASSIGN_OR_RETURN_IMPL(INFERD_CONCAT(inferd_or_, __LINE__), lhs, expr)
#define INFERD_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(*tmp)
