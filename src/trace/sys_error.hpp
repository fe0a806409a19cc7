// Describing a failed system call's errno for messages: the error's name and its meaning
// ("ENOENT (No such file or directory)"), without strerror()'s shared buffer.
#pragma once

#include <cstring>
#include <string>

namespace actpage::trace {

inline std::string errno_text(int error) {
  const char* name = strerrorname_np(error);
  const char* description = strerrordesc_np(error);
  return std::string(name != nullptr ? name : "errno " + std::to_string(error)) + " (" +
         (description != nullptr ? description : "unknown error") + ")";
}

}  // namespace actpage::trace
