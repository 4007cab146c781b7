// libFuzzer target: the data-plane frame decoder (proto/frame.h) on arbitrary bytes. A header
// that decodes must encode back to the same bytes, and decoding never crashes.

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "proto/frame.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvpool::wire;
  if (size >= kRequestHeaderSize) {
    absl::StatusOr<RequestHeader> request = DecodeRequest(data);
    if (request.ok()) {
      uint8_t again[kRequestHeaderSize];
      EncodeRequest(*request, again);
      absl::StatusOr<RequestHeader> twice = DecodeRequest(again);
      if (!twice.ok() || twice->offset != request->offset || twice->length != request->length ||
          twice->opcode != request->opcode) {
        std::abort();
      }
    }
  }
  if (size >= kResponseHeaderSize) {
    absl::StatusOr<ResponseHeader> response = DecodeResponse(data);
    if (response.ok()) {
      uint8_t again[kResponseHeaderSize];
      EncodeResponse(*response, again);
      absl::StatusOr<ResponseHeader> twice = DecodeResponse(again);
      if (!twice.ok() || twice->status != response->status || twice->length != response->length) {
        std::abort();
      }
    }
  }
  return 0;
}
