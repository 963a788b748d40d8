// The sizes of the flat slots (Note [flat slots] in transport/link.h, Note [flat lines] in
// engine/flat_slots.h), where transports (which provide the areas), the engine (which lays them
// out) and the flat all-reduce's selection (algorithms/flat_all_reduce.cc) can all see them.
#pragma once

#include <cstddef>

namespace mwms::collective {

/// Bytes of each rank's flat area: two sets, one per parity of the call number.
constexpr std::size_t kFlatAreaBytes = 16384;
constexpr std::size_t kFlatSetBytes = kFlatAreaBytes / 2;
/// A set is an identity line and data lines of 48 bytes of payload and a 16-byte tag.
constexpr std::size_t kFlatLineBytes = 64;
constexpr std::size_t kFlatLineData = 48;  // a multiple of every element size
constexpr std::size_t kFlatLines = kFlatSetBytes / kFlatLineBytes - 1;
/// The largest flat all-reduce in lines, in bytes (6096); larger ones are staged.
constexpr std::size_t kFlatPayloadBytes = kFlatLines * kFlatLineData;

/// Note [flat staging]: each rank's staging area, two sets of a head page (two tags on lines of
/// their own, the identity line) and up to kFlatStageBytes of data.
constexpr std::size_t kFlatStageBytes = std::size_t{1} << 20;
constexpr std::size_t kFlatStageHeadBytes = 4096;
constexpr std::size_t kFlatStageSetBytes = kFlatStageHeadBytes + kFlatStageBytes;
constexpr std::size_t kFlatStageAreaBytes = 2 * kFlatStageSetBytes;
/// A staged reduction's block: the partial sums stay in L1 while every rank's block is added.
constexpr std::size_t kFlatBlockBytes = 16384;

}  // namespace mwms::collective
