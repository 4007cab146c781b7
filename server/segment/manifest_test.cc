#include "server/segment/manifest.h"

#include "gtest/gtest.h"

namespace kvpool::segment {
namespace {

v1::ManifestRecord Record(v1::ManifestRecord::Kind kind, const std::string& key, uint64_t offset,
                          uint64_t size) {
  v1::ManifestRecord record;
  record.set_kind(kind);
  record.set_key(key);
  record.set_offset(offset);
  record.set_size(size);
  return record;
}

std::vector<std::string> Keys(const Manifest& manifest) {
  std::vector<std::string> keys;
  for (const v1::ManifestRecord& record : manifest.Entries()) keys.push_back(record.key());
  return keys;
}

TEST(ManifestTest, AddsForgetsAndReplacesOverlaps) {
  Manifest manifest;
  manifest.Apply({Record(v1::ManifestRecord::ADD, "a", 0, 100),
                  Record(v1::ManifestRecord::ADD, "b", 128, 100),
                  Record(v1::ManifestRecord::ADD, "c", 256, 100)});
  EXPECT_EQ(Keys(manifest), (std::vector<std::string>{"a", "b", "c"}));
  // A forget that names another key at that offset is stale: ignored.
  manifest.Apply({Record(v1::ManifestRecord::FORGET, "old", 128, 100)});
  EXPECT_EQ(manifest.size(), 3u);
  manifest.Apply({Record(v1::ManifestRecord::FORGET, "b", 128, 100)});
  EXPECT_EQ(Keys(manifest), (std::vector<std::string>{"a", "c"}));
  // A new object over part of two old ones replaces both.
  manifest.Apply({Record(v1::ManifestRecord::ADD, "d", 64, 256)});
  EXPECT_EQ(Keys(manifest), (std::vector<std::string>{"d"}));
}

TEST(ManifestTest, AcceptedWritesDropWhatTheyOverlap) {
  Manifest manifest;
  manifest.Apply({Record(v1::ManifestRecord::ADD, "a", 0, 100),
                  Record(v1::ManifestRecord::ADD, "b", 128, 100),
                  Record(v1::ManifestRecord::ADD, "c", 256, 100)});
  manifest.DropOverlapping(100, 28);  // the gap between a and b
  EXPECT_EQ(manifest.size(), 3u);
  manifest.DropOverlapping(99, 30);  // last byte of a, first of b
  EXPECT_EQ(Keys(manifest), (std::vector<std::string>{"c"}));
  manifest.Forget({"c"});
  EXPECT_EQ(manifest.size(), 0u);
}

}  // namespace
}  // namespace kvpool::segment
