// Expected<T>: a value or the message that explains why there is none.
//
// The launch code reads everything from outside (environment variables, sockets, peers), so
// every step can fail for a reason the user must read. Invariant: exactly one of value() and
// error() is meaningful; error() is a complete lower-case sentence fragment that planrun
// prints after "error: ". Made by the launch functions, read by planrun and the backends.
#ifndef PARAPLAN_RUNTIME_LAUNCH_EXPECTED_H_
#define PARAPLAN_RUNTIME_LAUNCH_EXPECTED_H_

#include <cassert>
#include <optional>
#include <string>
#include <utility>

namespace paraplan::launch {

struct Failure {
  std::string message;
};

inline Failure Fail(std::string message) { return Failure{std::move(message)}; }

// ok(), value() and error() keep std::expected's (and absl::StatusOr's) lower-case names, so
// that this class can give way to std::expected without touching its callers.
// NOLINTBEGIN(readability-identifier-naming)
template <typename T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : value_(std::move(value)) {}                    // NOLINT: implicit by design
  Expected(Failure failure) : error_(std::move(failure.message)) {}  // NOLINT

  bool ok() const { return value_.has_value(); }
  explicit operator bool() const { return ok(); }
  const T& value() const& {
    assert(ok());
    return *value_;
  }
  T& value() & {
    assert(ok());
    return *value_;
  }
  T&& value() && {
    assert(ok());
    return std::move(*value_);
  }
  const T& operator*() const& { return value(); }
  const T* operator->() const { return &value(); }
  const std::string& error() const { return error_; }

 private:
  std::optional<T> value_;
  std::string error_;
};
// NOLINTEND(readability-identifier-naming)

// For functions that only succeed or fail.
struct Ok {};

}  // namespace paraplan::launch

#endif  // PARAPLAN_RUNTIME_LAUNCH_EXPECTED_H_
