// Test-only fault injection for the checkpoint writer and the SSD tier: lets tests see ENOSPC
// and EIO without a full or failing disk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace embstore::io {

// hook(offset, bytes) is asked before each write FileWriter issues (offset and length as
// submitted, without O_DIRECT padding). 0 lets the write go ahead; a -errno is reported as
// that write's result and nothing is written. An empty function turns injection off. Global
// to the process; tests reset it when done.
void set_fault_injection(std::function<int(uint64_t offset, size_t bytes)> hook);

// The same for reads, asked before each page read of the SSD tier's page file (io::PageFile,
// both engines): a -errno fails that read, and the page's bytes are not handed out.
void set_read_fault_injection(std::function<int(uint64_t offset, size_t bytes)> hook);

}  // namespace embstore::io
