#pragma once

// What the bench's systems share: client memory that is touched up front (no page faults
// while measuring), rotating value slots, and blocking loopback sockets for the baselines
// that speak over TCP (raw TCP, Redis). Not thread-safe unless stated.

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace kvpool::bench {

// Page-aligned anonymous memory, filled with a byte pattern at allocation (every page
// touched), unmapped by the destructor. Movable.
class Buffer {
 public:
  Buffer() = default;
  // Aborts if the memory cannot be had (the bench cannot run without it).
  Buffer(size_t bytes, uint8_t seed);
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Consecutive value-sized slots in a Buffer, handed out `unit` at a time in rotation, so that
// successive calls touch different memory. Holds at least one unit and about `bytes`.
class SlotRing {
 public:
  SlotRing(uint64_t bytes, uint64_t value_size, int unit, uint8_t seed);
  // The first slot of the next unit; slot(first + k) for k < unit are the unit's slots.
  size_t NextUnit();
  uint8_t* slot(size_t index) const { return buffer_.data() + index * value_size_; }
  uint64_t value_size() const { return value_size_; }
  size_t unit() const { return unit_; }

 private:
  uint64_t value_size_;
  size_t unit_;
  size_t slots_;
  size_t next_ = 0;
  Buffer buffer_;
};

// A small fast PRNG (xorshift64*) for choosing keys.
class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t Next() {
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    return state_ * 0x2545F4914F6CDD1Dull;
  }
  uint64_t Below(uint64_t n) { return Next() % n; }
  double Uniform() { return static_cast<double>(Next() >> 11) / 9007199254740992.0; }

 private:
  uint64_t state_;
};

// A listening TCP socket on 127.0.0.1 and a free port (port 0). Returns the fd; `port` is set.
absl::StatusOr<int> ListenLoopback(uint16_t* port);
// A free loopback port for a server the bench starts (bound, read and released: another
// process could take it in between, which the caller detects by the server failing).
absl::StatusOr<uint16_t> FreeLoopbackPort();
// A blocking TCP connection to host:port with TCP_NODELAY; SO_SNDBUF/SO_RCVBUF when
// buffer_bytes > 0 (0 keeps the kernel's autotuning).
absl::StatusOr<int> ConnectBlocking(const std::string& host, uint16_t port, int buffer_bytes);
void SetSocketOptions(int fd, int buffer_bytes);
// Blocking writev/readv of every byte of `iov` (which they consume). Unavailable on error or
// when the peer closed.
absl::Status WriteAll(int fd, absl::Span<iovec> iov);
absl::Status ReadAll(int fd, absl::Span<iovec> iov);
absl::Status WriteAll(int fd, const void* data, size_t size);
absl::Status ReadAll(int fd, void* data, size_t size);

}  // namespace kvpool::bench
