// ridgescope/trace_format.h — constants of the .rstrace file format (spec: docs/trace_format.md).
//
// Layout: a 16-byte file header, then self-checking chunks. Each chunk is a 16-byte chunk
// header (magic, payload bytes, record count, CRC-32 of the payload) followed by the payload,
// a sequence of records: kind (1 byte), payload length (LEB128), payload (LEB128 fields).
// A process killed mid-run leaves whole chunks and at most one torn chunk at the end; readers
// keep the whole chunks and report the torn one with its byte offset.
//
// Thread-safety: constants only.
#pragma once

#include <cstdint>

namespace ridgescope::trace_format {

inline constexpr char kFileMagic[8] = {'R', 'I', 'D', 'G', 'E', 'S', 'C', 'P'};
// Version 2 added allocation sites: the `frame` and `stack` records (kinds 64, 65) and the alloc
// record's trailing stack id. Version 3 added device memory allocated outside PyTorch: the
// `external_alloc` and `external_free` records (kinds 13, 14). Version 4 added the bounded
// flight recorder (keep_steps): the `mark` record (kind 15), per-step summaries, kept windows
// that start from a checkpoint of the ledger, and chunks whose time chain restarts (kinds 66-72;
// ridgescope/flight_records.h). Readers read every version from kMinVersion to kVersion.
inline constexpr std::uint32_t kVersion = 4;           // bump on any incompatible change
// The first version whose kinds 13 and 14 are external_alloc/external_free (older files skip
// them as unknown timed kinds). One constant, so that another additive change can renumber it.
inline constexpr std::uint32_t kFirstExternalVersion = 3;
// The first version with the flight recorder's kinds (older files skip 15 as an unknown timed
// kind and 66-72 as unknown untimed kinds).
inline constexpr std::uint32_t kFirstFlightVersion = 4;
inline constexpr std::uint32_t kMinVersion = 1;
inline constexpr std::uint32_t kFileHeaderBytes = 16;  // magic(8) version(4) flags(4)
inline constexpr std::uint32_t kChunkMagic = 0x4B4E4843;  // "CHNK" little-endian
inline constexpr std::uint32_t kChunkHeaderBytes = 16;  // magic(4) payload(4) records(4) crc(4)
inline constexpr std::uint32_t kTargetChunkBytes = 256 * 1024;  // writers flush at this size
inline constexpr std::uint32_t kMaxChunkBytes = 64 * 1024 * 1024;  // readers reject larger

}  // namespace ridgescope::trace_format
