// errno's text (see errno_text.h).
#include "base/errno_text.h"

#include <cstring>

#include "base/status.h"

namespace glm {

std::string errno_text(int err) {
  char buffer[256] = {0};
  // GNU strerror_r returns the text (maybe not in buffer); the XSI one fills buffer.
#if defined(__GLIBC__) && defined(_GNU_SOURCE)
  const char* text = ::strerror_r(err, buffer, sizeof(buffer));
#else
  const char* text = ::strerror_r(err, buffer, sizeof(buffer)) == 0 ? buffer : nullptr;
#endif
  return text != nullptr && *text != '\0' ? std::string(text) : concat("error ", err);
}

}  // namespace glm
