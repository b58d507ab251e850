// CRC-32C (Castagnoli, polynomial 0x1EDC6F41 reflected 0x82F63B78), the checksum of every
// checkpoint slice. Hardware (SSE4.2 crc32 instruction) when the CPU has it, else a table.
#pragma once

#include <cstddef>
#include <cstdint>

namespace llmtrain {

// Extends `crc` (the value returned for the data so far; 0 to start) with `size` bytes.
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t size);
inline uint32_t crc32c(const void* data, size_t size) { return crc32c_extend(0, data, size); }
// The table-driven version, used where the CPU lacks the instruction (exposed for tests).
uint32_t crc32c_extend_portable(uint32_t crc, const void* data, size_t size);

}  // namespace llmtrain
