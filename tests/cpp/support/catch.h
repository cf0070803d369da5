// catch.h — includes Catch2 v2 or v3, whichever the build found (RIDGESCOPE_CATCH2_MAJOR).
#pragma once
#if RIDGESCOPE_CATCH2_MAJOR >= 3
#include <catch2/catch_all.hpp>
#else
#include <catch2/catch.hpp>
#endif
