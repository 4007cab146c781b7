#include "engine_plugin/device_staging.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

namespace kvpool::engine {
namespace {

using ::testing::HasSubstr;

// A fake driver: two "devices" (host arenas the fake calls device memory of contexts A and B),
// copies done with memcpy, each checked to run with its memory's context current.
struct FakeGpu {
  std::vector<uint8_t> arena[2] = {std::vector<uint8_t>(1 << 20), std::vector<uint8_t>(1 << 20)};
  int contexts[2] = {0, 1};  // their addresses are the contexts
  int dtoh = 0, htod = 0, host_allocs = 0, host_frees = 0, syncs = 0;
  bool fail_dtoh = false;
  bool wrong_context = false;
  uint64_t device(int gpu, size_t offset) {
    return reinterpret_cast<uint64_t>(arena[gpu].data() + offset);
  }
  void* context(int gpu) { return &contexts[gpu]; }
  // The context that owns `ptr`, or null.
  void* Owner(uint64_t ptr) {
    for (int g = 0; g < 2; ++g) {
      uint64_t base = device(g, 0);
      if (ptr >= base && ptr < base + arena[g].size()) return context(g);
    }
    return nullptr;
  }
};

FakeGpu* gpu = nullptr;
thread_local std::vector<void*> current;

CudaDriver FakeDriver() {
  CudaDriver d{};
  d.PointerGetAttributes = [](unsigned count, int* attributes, void** data, uint64_t ptr) {
    void* owner = gpu->Owner(ptr);
    for (unsigned i = 0; i < count; ++i) {
      switch (attributes[i]) {
        case CudaDriver::kAttributeMemoryType:
          *static_cast<unsigned*>(data[i]) = owner != nullptr ? CudaDriver::kMemoryTypeDevice : 0;
          break;
        case CudaDriver::kAttributeIsManaged:
          *static_cast<int*>(data[i]) = 0;
          break;
        case CudaDriver::kAttributeContext:
          *static_cast<void**>(data[i]) = owner;
          break;
        case CudaDriver::kAttributeRangeStart:
          *static_cast<uint64_t*>(data[i]) =
              owner == nullptr ? 0 : gpu->device(owner == gpu->context(0) ? 0 : 1, 0);
          break;
        case CudaDriver::kAttributeRangeSize:
          *static_cast<size_t*>(data[i]) = owner == nullptr ? 0 : gpu->arena[0].size();
          break;
      }
    }
    return 0;
  };
  d.CtxPushCurrent = [](void* context) {
    current.push_back(context);
    return 0;
  };
  d.CtxPopCurrent = [](void** context) {
    *context = current.back();
    current.pop_back();
    return 0;
  };
  d.MemHostAlloc = [](void** ptr, size_t bytes, unsigned) {
    ++gpu->host_allocs;
    *ptr = std::malloc(bytes);
    return 0;
  };
  d.MemFreeHost = [](void* ptr) {
    ++gpu->host_frees;
    std::free(ptr);
    return 0;
  };
  d.StreamCreate = [](void** stream, unsigned) {
    *stream = current.back();  // one stream per context: its context, for the checks below
    return 0;
  };
  d.StreamDestroy = [](void*) { return 0; };
  d.StreamSynchronize = [](void*) {
    ++gpu->syncs;
    return 0;
  };
  d.MemcpyDtoHAsync = [](void* dst, uint64_t src, size_t bytes, void* stream) {
    if (gpu->fail_dtoh) return 700;  // CUDA_ERROR_ILLEGAL_ADDRESS
    if (current.empty() || current.back() != gpu->Owner(src) || stream != current.back()) {
      gpu->wrong_context = true;
    }
    ++gpu->dtoh;
    std::memcpy(dst, reinterpret_cast<const void*>(src), bytes);
    return 0;
  };
  d.MemcpyHtoDAsync = [](uint64_t dst, const void* src, size_t bytes, void* stream) {
    if (current.empty() || current.back() != gpu->Owner(dst) || stream != current.back()) {
      gpu->wrong_context = true;
    }
    ++gpu->htod;
    std::memcpy(reinterpret_cast<void*>(dst), src, bytes);
    return 0;
  };
  d.GetErrorString = [](int result, const char** text) {
    *text = result == 700 ? "an illegal memory access was encountered" : "unknown";
    return 0;
  };
  return d;
}

class DeviceStagingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    gpu = &fake_;
    for (int g = 0; g < 2; ++g) {
      for (size_t i = 0; i < fake_.arena[g].size(); ++i) {
        fake_.arena[g][i] = static_cast<uint8_t>(i * 7 + g * 13 + i / 251);
      }
    }
  }
  void TearDown() override { gpu = nullptr; }

  // Places of every part, as the Store finds them.
  std::vector<MemoryPlace> PlacesOf(DeviceStaging& staging, const std::vector<PutItem>& items) {
    std::vector<MemoryPlace> places;
    for (const PutItem& item : items) {
      for (const ConstBuffer& part : item.parts) {
        places.push_back(*staging.Locate(reinterpret_cast<uint64_t>(part.data), part.size));
      }
    }
    return places;
  }

  FakeGpu fake_;
};

std::string Bytes(const void* data, size_t n) {
  return std::string(static_cast<const char*>(data), n);
}

std::string Value(const PutItem& item) {
  std::string value;
  for (const ConstBuffer& part : item.parts) value += Bytes(part.data, part.size);
  return value;
}

TEST_F(DeviceStagingTest, WithoutCudaInThisProcessEverythingIsHost) {
  // This test binary never loads libcuda.
  DeviceStaging staging(DeviceStaging::Options{});
  EXPECT_EQ(staging.driver(), nullptr);
  int x = 0;
  absl::StatusOr<MemoryPlace> place = staging.Locate(reinterpret_cast<uint64_t>(&x), sizeof x);
  ASSERT_TRUE(place.ok());
  EXPECT_FALSE(place->on_device());
}

TEST_F(DeviceStagingTest, LocatesDeviceAndHostMemoryAndRefusesRangesPastAnAllocation) {
  DeviceStaging staging(DeviceStaging::Options{}, FakeDriver());
  ASSERT_NE(staging.driver(), nullptr);
  absl::StatusOr<MemoryPlace> device = staging.Locate(fake_.device(1, 4096), 4096);
  ASSERT_TRUE(device.ok());
  EXPECT_EQ(device->device_context, fake_.context(1));
  std::vector<uint8_t> host(64);
  absl::StatusOr<MemoryPlace> on_host =
      staging.Locate(reinterpret_cast<uint64_t>(host.data()), host.size());
  ASSERT_TRUE(on_host.ok());
  EXPECT_FALSE(on_host->on_device());
  absl::StatusOr<MemoryPlace> past =
      staging.Locate(fake_.device(0, fake_.arena[0].size() - 100), 101);
  EXPECT_EQ(past.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(past.status().message(), HasSubstr("past the end of its device allocation"));
}

// Mooncake's connector pattern: each key is one block of every layer; blocks of a layer are
// neighbours in the cache. The put sees host memory holding the device bytes, and the copies
// of each layer's neighbouring blocks are merged into one.
TEST_F(DeviceStagingTest, PutStagesDevicePartsAndMergesNeighbours) {
  DeviceStaging staging(DeviceStaging::Options{}, FakeDriver());
  constexpr size_t kBlock = 4096, kLayers = 3, kKeys = 8, kLayerBytes = 64 << 10;
  std::vector<uint8_t> host_header(100, 0x5a);
  std::vector<PutItem> items(kKeys);
  std::vector<std::string> expected;
  for (size_t k = 0; k < kKeys; ++k) {
    items[k].key = "key" + std::to_string(k);
    items[k].parts.push_back({host_header.data(), host_header.size()});
    for (size_t l = 0; l < kLayers; ++l) {
      // Keys in reverse block order: the merge must not depend on the keys' order.
      size_t block = kKeys - 1 - k;
      items[k].parts.push_back(
          {reinterpret_cast<void*>(fake_.device(0, l * kLayerBytes + block * kBlock)), kBlock});
    }
    expected.push_back(Value(items[k]));
  }
  std::vector<MemoryPlace> places = PlacesOf(staging, items);
  std::vector<std::string> seen;
  std::vector<absl::Status> results =
      staging.Put(items, places, [&](absl::Span<const PutItem> staged) {
        for (const PutItem& item : staged) {
          for (const ConstBuffer& part : item.parts) {
            EXPECT_EQ(fake_.Owner(reinterpret_cast<uint64_t>(part.data)), nullptr)
                << "the put was given device memory";
          }
          seen.push_back(Value(item));
        }
        return std::vector<absl::Status>(staged.size());
      });
  ASSERT_EQ(results.size(), kKeys);
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(seen, expected);
  EXPECT_EQ(fake_.dtoh, static_cast<int>(kLayers));  // one copy per layer
  EXPECT_EQ(staging.copies_queued(), kLayers);
  EXPECT_FALSE(fake_.wrong_context);
  EXPECT_EQ(fake_.host_allocs, 1);
  // The pinned buffer is reused by the next call.
  results = staging.Put(items, places, [&](absl::Span<const PutItem> staged) {
    return std::vector<absl::Status>(staged.size());
  });
  EXPECT_EQ(fake_.host_allocs, 1);
}

TEST_F(DeviceStagingTest, PutCutsALargeBatchIntoWindowsInOrder) {
  DeviceStaging staging(DeviceStaging::Options{.window_bytes = 10000}, FakeDriver());
  std::vector<PutItem> items;
  std::vector<std::string> expected;
  for (size_t k = 0; k < 7; ++k) {
    // 4096 bytes per key on two GPUs alternately: two keys per window.
    items.push_back(
        PutItem{.key = "k" + std::to_string(k),
                .parts = {{reinterpret_cast<void*>(fake_.device(k % 2, k * 8192)), 4096}}});
    expected.push_back(Value(items.back()));
  }
  std::vector<MemoryPlace> places = PlacesOf(staging, items);
  std::vector<size_t> window_sizes;
  std::vector<std::string> seen;
  std::vector<absl::Status> results =
      staging.Put(items, places, [&](absl::Span<const PutItem> staged) {
        window_sizes.push_back(staged.size());
        std::vector<absl::Status> out;
        for (const PutItem& item : staged) {
          seen.push_back(Value(item));
          out.push_back(item.key == "k5" ? absl::AlreadyExistsError("k5") : absl::OkStatus());
        }
        return out;
      });
  EXPECT_THAT(window_sizes, ::testing::ElementsAre(2, 2, 2, 1));
  EXPECT_EQ(seen, expected);
  ASSERT_EQ(results.size(), 7u);
  for (size_t k = 0; k < 7; ++k) {
    EXPECT_EQ(results[k].code(), k == 5 ? absl::StatusCode::kAlreadyExists : absl::StatusCode::kOk);
  }
  EXPECT_FALSE(fake_.wrong_context);
  EXPECT_EQ(fake_.host_allocs, 1);  // one window at a time
}

TEST_F(DeviceStagingTest, AFailedCopyFailsItsWindowAndPutsNothing) {
  DeviceStaging staging(DeviceStaging::Options{}, FakeDriver());
  std::vector<PutItem> items = {
      {.key = "a", .parts = {{reinterpret_cast<void*>(fake_.device(0, 0)), 1024}}},
      {.key = "b", .parts = {{reinterpret_cast<void*>(fake_.device(0, 8192)), 1024}}}};
  std::vector<MemoryPlace> places = PlacesOf(staging, items);
  fake_.fail_dtoh = true;
  bool called = false;
  std::vector<absl::Status> results =
      staging.Put(items, places, [&](absl::Span<const PutItem> staged) {
        called = true;
        return std::vector<absl::Status>(staged.size());
      });
  EXPECT_FALSE(called);
  ASSERT_EQ(results.size(), 2u);
  for (const absl::Status& s : results) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
    EXPECT_THAT(s.message(), HasSubstr("cuMemcpyDtoHAsync: an illegal memory access"));
  }
  // The pinned buffer went back to the pool: the next call allocates nothing.
  fake_.fail_dtoh = false;
  staging.Put(items, places, [&](absl::Span<const PutItem> staged) {
    return std::vector<absl::Status>(staged.size());
  });
  EXPECT_EQ(fake_.host_allocs, 1);
}

// Gets: each key's bytes read land in its device parts, in part order, and only those: a key
// shorter than its buffers leaves the rest untouched, a key that failed leaves all of them.
TEST_F(DeviceStagingTest, GetCopiesTheBytesReadIntoDeviceParts) {
  DeviceStaging staging(DeviceStaging::Options{}, FakeDriver());
  std::vector<uint8_t> host_part(300, 0);
  std::vector<GetItem> items = {
      // 300 host bytes then 2 x 1000 device bytes; the value is 1500 bytes.
      {.key = "short",
       .parts = {{host_part.data(), host_part.size()},
                 {reinterpret_cast<void*>(fake_.device(0, 0)), 1000},
                 {reinterpret_cast<void*>(fake_.device(1, 5000)), 1000}}},
      {.key = "missing", .parts = {{reinterpret_cast<void*>(fake_.device(0, 20000)), 1000}}},
      {.key = "full", .parts = {{reinterpret_cast<void*>(fake_.device(0, 1000)), 1000}}},
  };
  std::vector<MemoryPlace> places;
  for (const GetItem& item : items) {
    for (const MutableBuffer& part : item.parts) {
      places.push_back(*staging.Locate(reinterpret_cast<uint64_t>(part.data), part.size));
    }
  }
  const std::vector<uint8_t> before[2] = {fake_.arena[0], fake_.arena[1]};
  auto value = [](const std::string& key, size_t n) {
    std::string v(n, 0);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>(key[0] + i % 101);
    return v;
  };
  std::vector<absl::StatusOr<uint64_t>> results =
      staging.Get(items, places, [&](absl::Span<const GetItem> staged) {
        std::vector<absl::StatusOr<uint64_t>> out;
        for (const GetItem& item : staged) {
          if (item.key == "missing") {
            // A failed read may leave anything in its buffers.
            std::memset(item.parts[0].data, 0xee, item.parts[0].size);
            out.push_back(absl::NotFoundError("missing"));
            continue;
          }
          size_t n = item.key == "short" ? 1500 : 1000;
          std::string v = value(item.key, n);
          size_t at = 0;
          for (const MutableBuffer& part : item.parts) {
            EXPECT_EQ(fake_.Owner(reinterpret_cast<uint64_t>(part.data)), nullptr);
            size_t take = std::min(part.size, n - at);
            std::memcpy(part.data, v.data() + at, take);
            at += take;
          }
          out.push_back(n);
        }
        return out;
      });
  ASSERT_EQ(results.size(), 3u);
  EXPECT_EQ(*results[0], 1500u);
  EXPECT_EQ(results[1].status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*results[2], 1000u);
  std::string short_value = value("short", 1500);
  EXPECT_EQ(Bytes(host_part.data(), 300), short_value.substr(0, 300));
  EXPECT_EQ(Bytes(fake_.arena[0].data(), 1000), short_value.substr(300, 1000));
  EXPECT_EQ(Bytes(fake_.arena[1].data() + 5000, 200), short_value.substr(1300, 200));
  // Past the value's end, and the failed key's buffer: as they were.
  EXPECT_EQ(Bytes(fake_.arena[1].data() + 5200, 800), Bytes(before[1].data() + 5200, 800));
  EXPECT_EQ(Bytes(fake_.arena[0].data() + 20000, 1000), Bytes(before[0].data() + 20000, 1000));
  EXPECT_EQ(Bytes(fake_.arena[0].data() + 1000, 1000), value("full", 1000));
  EXPECT_FALSE(fake_.wrong_context);
  // "short"'s first device part and "full"'s are neighbours on GPU 0: one copy there, one on
  // GPU 1.
  EXPECT_EQ(fake_.htod, 2);
}

TEST_F(DeviceStagingTest, SingleRangesBothWays) {
  DeviceStaging staging(DeviceStaging::Options{}, FakeDriver());
  MemoryPlace place = *staging.Locate(fake_.device(1, 100), 50);
  std::string out(50, 0);
  ASSERT_TRUE(staging.CopyOut(out.data(), fake_.device(1, 100), 50, place).ok());
  EXPECT_EQ(out, Bytes(fake_.arena[1].data() + 100, 50));
  std::string in(50, 'x');
  ASSERT_TRUE(staging.CopyIn(fake_.device(1, 100), in.data(), 50, place).ok());
  EXPECT_EQ(Bytes(fake_.arena[1].data() + 100, 50), in);
  EXPECT_FALSE(fake_.wrong_context);
}

}  // namespace
}  // namespace kvpool::engine
