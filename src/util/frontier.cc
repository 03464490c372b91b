#include "tidemark/frontier.h"

namespace tidemark {

std::string Frontier::to_string() const {
  return is_closed() ? std::string("closed") : std::to_string(*time_);
}

std::string Frontier::to_json() const {
  return is_closed() ? std::string("null") : std::to_string(*time_);
}

std::string Description::to_string() const {
  return "[" + lower.to_string() + ", " + upper.to_string() + ") since " + since.to_string();
}

}  // namespace tidemark
