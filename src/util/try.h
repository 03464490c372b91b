// TM_TRY and TM_ASSIGN: early returns for Result-returning code, inside
// Tidemark's own sources (the public headers do without them, so a program
// that includes them gets no macros).
//
//   TM_TRY(file->sync());                       // returns its error, if any
//   TM_ASSIGN(auto bytes, blob.get(key));       // or the value
#pragma once

#include <expected>
#include <utility>

// Propagates the error of a Result-returning expression, or yields nothing.
#define TM_TRY(expr)                                                     \
  do {                                                                   \
    auto tm_try_result_ = (expr);                                        \
    if (!tm_try_result_) return std::unexpected(tm_try_result_.error()); \
  } while (0)

// Assigns the value of a Result-returning expression to `lhs`, or returns
// its error. `lhs` may be a declaration: TM_ASSIGN(auto x, f());
#define TM_CONCAT_INNER(a, b) a##b
#define TM_CONCAT(a, b) TM_CONCAT_INNER(a, b)
#define TM_ASSIGN(lhs, expr) TM_ASSIGN_IMPL(TM_CONCAT(tm_assign_, __LINE__), lhs, expr)
#define TM_ASSIGN_IMPL(tmp, lhs, expr)                      \
  auto tmp = (expr);                                        \
  if (!tmp) return std::unexpected(std::move(tmp).error()); \
  lhs = std::move(*tmp)
