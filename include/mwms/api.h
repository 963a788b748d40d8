/// @file api.h
/// Symbol visibility: the library is built with -fvisibility=hidden and exports only what is marked
/// MWMS_API (NCCL's NCCL_API idea).
#pragma once

#if defined(_WIN32)
#define MWMS_API
#else
#define MWMS_API __attribute__((visibility("default")))
#endif
