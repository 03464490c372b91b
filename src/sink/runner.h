// Moved: tidemark/sink.h. (Kept until src/server includes that instead.)
#pragma once
#include "tidemark/sink.h"
