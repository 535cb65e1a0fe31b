// Translation unit that builds the shared precompiled header (src/core/torch_pch.h).
#include "core/torch_pch.h"
