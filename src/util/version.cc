#include "tidemark/version.h"

namespace tidemark {

const char* version() {
  return TIDEMARK_VERSION_STRING;
}

}  // namespace tidemark
