#include "server/segment/manifest.h"

#include <algorithm>
#include <string>
#include <vector>

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

TEST(ManifestTest, ReadsNotedAreTakenOnceAndCapped) {
  Manifest manifest;
  manifest.NoteRead("a");
  manifest.NoteRead("b");
  manifest.NoteRead("a");
  std::vector<std::string> taken = manifest.TakeReads();
  std::sort(taken.begin(), taken.end());
  EXPECT_EQ(taken, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(manifest.TakeReads().empty());
  for (size_t i = 0; i < Manifest::kMaxReadsNoted + 10; ++i) manifest.NoteRead(std::to_string(i));
  EXPECT_EQ(manifest.TakeReads().size(), Manifest::kMaxReadsNoted);
}

TEST(ManifestTest, FindsEntriesByKeyUntilTheyGo) {
  Manifest manifest;
  v1::ManifestRecord a = Record(v1::ManifestRecord::ADD, "a", 0, 100);
  a.set_checksum(11);
  a.set_grant(7);
  manifest.Apply({a, Record(v1::ManifestRecord::ADD, "b", 128, 100)});
  std::optional<Manifest::Found> found = manifest.Find("a");
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->offset, 0u);
  EXPECT_EQ(found->size, 100u);
  EXPECT_EQ(found->checksum, 11u);
  EXPECT_EQ(found->grant, 7u);
  EXPECT_TRUE(manifest.Holds("a", *found));
  EXPECT_FALSE(manifest.Find("c").has_value());
  // Gone by FORGET, by an overlapping ADD, by a write, by a refusal: found no more, and what
  // was found is no longer held.
  manifest.Apply({Record(v1::ManifestRecord::FORGET, "a", 0, 100)});
  EXPECT_FALSE(manifest.Find("a").has_value());
  EXPECT_FALSE(manifest.Holds("a", *found));
  manifest.Apply({a});
  manifest.Apply({Record(v1::ManifestRecord::ADD, "d", 50, 10)});
  EXPECT_FALSE(manifest.Find("a").has_value());
  EXPECT_TRUE(manifest.Find("d").has_value());
  manifest.DropOverlapping(130, 1);
  EXPECT_FALSE(manifest.Find("b").has_value());
  manifest.Forget({"d"});
  EXPECT_FALSE(manifest.Find("d").has_value());
  // The same key committed again elsewhere: the new entry is found, the old one not held.
  manifest.Apply({a});
  found = manifest.Find("a");
  v1::ManifestRecord moved = a;
  moved.set_offset(512);
  moved.set_grant(8);
  manifest.Apply({Record(v1::ManifestRecord::FORGET, "a", 0, 100), moved});
  EXPECT_FALSE(manifest.Holds("a", *found));
  EXPECT_EQ(manifest.Find("a")->offset, 512u);
  // Held at two offsets at once: the later ADD is found, and dropping the earlier entry
  // leaves it so.
  manifest.Apply({a});
  EXPECT_EQ(manifest.Find("a")->offset, 0u);
  manifest.Apply({Record(v1::ManifestRecord::FORGET, "a", 512, 100)});
  ASSERT_TRUE(manifest.Find("a").has_value());
  EXPECT_EQ(manifest.Find("a")->offset, 0u);
  EXPECT_EQ(manifest.Find("a")->grant, 7u);
  manifest.Apply({Record(v1::ManifestRecord::FORGET, "a", 0, 100)});
  EXPECT_FALSE(manifest.Find("a").has_value());
  EXPECT_EQ(manifest.size(), 0u);
}

}  // namespace
}  // namespace kvpool::segment
