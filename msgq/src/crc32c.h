/* CRC32C (Castagnoli), the optional per-message checksum of a queue.
 *
 * Hardware where the CPU has it, chosen once at run time: SSE4.2 `crc32` on x86-64,
 * the ARMv8 CRC32C instructions on AArch64; elsewhere a table-driven portable version.
 * All give the same value (standard CRC-32C: reflected, init and final xor 0xFFFFFFFF;
 * crc32c("123456789") == 0xE3069283). */
#ifndef MSGQ_CRC32C_H
#define MSGQ_CRC32C_H

#include <stddef.h>
#include <stdint.h>

uint32_t msgq_crc32c(const void *data, size_t len);

/* The portable version, always available (tests compare it with the hardware one). */
uint32_t msgq_crc32c_portable(const void *data, size_t len);

/* "sse4.2", "armv8-crc" or "portable": what msgq_crc32c uses on this machine. */
const char *msgq_crc32c_implementation(void);

#endif
