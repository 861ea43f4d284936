// Files read from a checkpoint directory, which other processes share and may plant anything in
// (a FIFO, a link to /dev/zero, a socket, a directory named like a file): every reader opens
// them here, only as regular files, and reads a whole file only up to a size known beforehand.
// liburing style: 0 or -errno.
#pragma once

#include <sys/stat.h>

#include <cerrno>
#include <cstddef>
#include <string>

namespace embstore::io {

// What open_regular and read_regular return for a path that is not a regular file (open(2)
// never returns ESPIPE); a symbolic link is -ELOOP. Readers report both as a corrupt
// checkpoint, not as an I/O error: regular_file_error says which.
inline constexpr int kNotRegularFile = -ESPIPE;

// Opens path read-only (plus extra_flags, e.g. O_DIRECT) without following a link and without
// blocking (a FIFO's open would wait for a writer), checks with fstat that it is a regular file,
// then makes the descriptor blocking. *fd and, when st is not null, *st on success.
int open_regular(const std::string& path, int extra_flags, int* fd, struct stat* st = nullptr);

// The whole file, when it holds at most max_bytes: -EFBIG past that, also for a file that grows
// while it is read. A file in a checkpoint directory has a size the reader knows (the manifest
// says it) or a cap of its kind (include/embstore/embstore.h, "Files read from a checkpoint
// directory").
int read_regular(const std::string& path, size_t max_bytes, std::string* out);

// "not a regular file", "a symbolic link, not a regular file", or strerror's text.
std::string regular_file_error(int r);

}  // namespace embstore::io
