// The live console's page (GET /): see console.cc.
#pragma once

#include <string_view>

namespace tidemark {

// The whole page, HTML with its style and script inline.
std::string_view console_page();

}  // namespace tidemark
