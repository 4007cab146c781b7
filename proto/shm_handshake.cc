#include "proto/shm_handshake.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "proto/little_endian.h"

namespace kvpool::wire {
std::string EncodeShmHello() {
  std::string hello(kShmHelloSize, '\0');
  StoreLittleEndian<uint32_t>(reinterpret_cast<uint8_t*>(hello.data()) + 0, kShmHelloMagic);
  StoreLittleEndian<uint32_t>(reinterpret_cast<uint8_t*>(hello.data()) + 4, kShmVersion);
  return hello;
}

absl::Status DecodeShmHello(const uint8_t hello[kShmHelloSize]) {
  if (LoadLittleEndian<uint32_t>(hello + 0) != kShmHelloMagic) {
    return absl::InvalidArgumentError("not a kvpool shared-memory hello");
  }
  if (uint32_t version = LoadLittleEndian<uint32_t>(hello + 4); version != kShmVersion) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported handshake version ", version));
  }
  return absl::OkStatus();
}

std::string EncodeShmAnswer(const ShmAnswer& answer) {
  std::string out(kShmAnswerSize, '\0');
  StoreLittleEndian<uint32_t>(reinterpret_cast<uint8_t*>(out.data()) + 0, kShmAnswerMagic);
  StoreLittleEndian<int32_t>(reinterpret_cast<uint8_t*>(out.data()) + 4, answer.status);
  StoreLittleEndian<uint64_t>(reinterpret_cast<uint8_t*>(out.data()) + 8, answer.pool_size);
  StoreLittleEndian<uint64_t>(reinterpret_cast<uint8_t*>(out.data()) + 16, answer.incarnation);
  StoreLittleEndian<uint32_t>(reinterpret_cast<uint8_t*>(out.data()) + 24, static_cast<uint32_t>(answer.reason.size()));
  return out + answer.reason;
}

absl::StatusOr<ShmAnswer> DecodeShmAnswer(const uint8_t fixed[kShmAnswerSize],
                                          uint32_t* reason_length) {
  if (LoadLittleEndian<uint32_t>(fixed + 0) != kShmAnswerMagic) {
    return absl::InvalidArgumentError("not a kvpool shared-memory answer");
  }
  ShmAnswer answer;
  answer.status = LoadLittleEndian<int32_t>(fixed + 4);
  answer.pool_size = LoadLittleEndian<uint64_t>(fixed + 8);
  answer.incarnation = LoadLittleEndian<uint64_t>(fixed + 16);
  *reason_length = LoadLittleEndian<uint32_t>(fixed + 24);
  if (*reason_length > 4096) return absl::InvalidArgumentError("reason too long");
  return answer;
}

namespace {

std::string EncodeHeader(uint32_t magic, size_t count, size_t entry_size) {
  std::string out(kShmMessageHeaderSize + count * entry_size, '\0');
  StoreLittleEndian<uint32_t>(reinterpret_cast<uint8_t*>(out.data()) + 0, magic);
  StoreLittleEndian<uint32_t>(reinterpret_cast<uint8_t*>(out.data()) + 4,
                              static_cast<uint32_t>(count));
  return out;
}

absl::Status CheckBody(const ShmMessageHeader& header, ShmMessageKind kind,
                       absl::Span<const uint8_t> body) {
  if (header.kind != kind || body.size() != header.body_size) {
    return absl::InvalidArgumentError("shared-memory message body does not match its header");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ShmMessageHeader> DecodeShmMessageHeader(
    const uint8_t header[kShmMessageHeaderSize]) {
  ShmMessageHeader decoded;
  size_t entry_size = 0;
  switch (LoadLittleEndian<uint32_t>(header + 0)) {
    case kShmIntentsMagic:
      decoded.kind = ShmMessageKind::kIntents;
      entry_size = kShmIntentEntrySize;
      break;
    case kShmDoneMagic:
      decoded.kind = ShmMessageKind::kDone;
      entry_size = kShmDoneEntrySize;
      break;
    case kShmReplyMagic:
      decoded.kind = ShmMessageKind::kReply;
      entry_size = kShmReplyEntrySize;
      break;
    default:
      return absl::InvalidArgumentError("not a kvpool shared-memory message");
  }
  decoded.count = LoadLittleEndian<uint32_t>(header + 4);
  if (decoded.count == 0 || decoded.count > kShmMaxEntries) {
    return absl::InvalidArgumentError(absl::StrCat("shared-memory message with ", decoded.count,
                                                   " entries (1 to ", kShmMaxEntries, ")"));
  }
  if (LoadLittleEndian<uint64_t>(header + 8) != 0) {
    return absl::InvalidArgumentError("shared-memory message with reserved bits set");
  }
  decoded.body_size = decoded.count * entry_size;
  return decoded;
}

std::string EncodeShmIntents(absl::Span<const ShmIntent> intents) {
  std::string out = EncodeHeader(kShmIntentsMagic, intents.size(), kShmIntentEntrySize);
  uint8_t* at = reinterpret_cast<uint8_t*>(out.data()) + kShmMessageHeaderSize;
  for (const ShmIntent& intent : intents) {
    StoreLittleEndian<uint64_t>(at + 0, intent.offset);
    StoreLittleEndian<uint64_t>(at + 8, intent.length);
    std::memcpy(at + 16, intent.token.data(), kTokenSize);
    at += kShmIntentEntrySize;
  }
  return out;
}

std::string EncodeShmDone(absl::Span<const uint64_t> ids) {
  std::string out = EncodeHeader(kShmDoneMagic, ids.size(), kShmDoneEntrySize);
  uint8_t* at = reinterpret_cast<uint8_t*>(out.data()) + kShmMessageHeaderSize;
  for (uint64_t id : ids) {
    StoreLittleEndian<uint64_t>(at, id);
    at += kShmDoneEntrySize;
  }
  return out;
}

std::string EncodeShmReplies(absl::Span<const ShmReply> replies) {
  std::string out = EncodeHeader(kShmReplyMagic, replies.size(), kShmReplyEntrySize);
  uint8_t* at = reinterpret_cast<uint8_t*>(out.data()) + kShmMessageHeaderSize;
  for (const ShmReply& reply : replies) {
    StoreLittleEndian<int32_t>(at + 0, reply.status);
    StoreLittleEndian<uint64_t>(at + 8, reply.intent);
    at += kShmReplyEntrySize;
  }
  return out;
}

absl::StatusOr<std::vector<ShmIntent>> DecodeShmIntents(const ShmMessageHeader& header,
                                                        absl::Span<const uint8_t> body) {
  if (absl::Status fits = CheckBody(header, ShmMessageKind::kIntents, body); !fits.ok()) {
    return fits;
  }
  std::vector<ShmIntent> intents(header.count);
  const uint8_t* at = body.data();
  for (ShmIntent& intent : intents) {
    intent.offset = LoadLittleEndian<uint64_t>(at + 0);
    intent.length = LoadLittleEndian<uint64_t>(at + 8);
    std::memcpy(intent.token.data(), at + 16, kTokenSize);
    at += kShmIntentEntrySize;
  }
  return intents;
}

absl::StatusOr<std::vector<uint64_t>> DecodeShmDone(const ShmMessageHeader& header,
                                                    absl::Span<const uint8_t> body) {
  if (absl::Status fits = CheckBody(header, ShmMessageKind::kDone, body); !fits.ok()) {
    return fits;
  }
  std::vector<uint64_t> ids(header.count);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = LoadLittleEndian<uint64_t>(body.data() + i * kShmDoneEntrySize);
  }
  return ids;
}

absl::StatusOr<std::vector<ShmReply>> DecodeShmReplies(const ShmMessageHeader& header,
                                                       absl::Span<const uint8_t> body) {
  if (absl::Status fits = CheckBody(header, ShmMessageKind::kReply, body); !fits.ok()) {
    return fits;
  }
  std::vector<ShmReply> replies(header.count);
  const uint8_t* at = body.data();
  for (ShmReply& reply : replies) {
    reply.status = LoadLittleEndian<int32_t>(at + 0);
    if (LoadLittleEndian<uint32_t>(at + 4) != 0) {
      return absl::InvalidArgumentError("shared-memory answer with reserved bits set");
    }
    reply.intent = LoadLittleEndian<uint64_t>(at + 8);
    at += kShmReplyEntrySize;
  }
  return replies;
}

}  // namespace kvpool::wire
