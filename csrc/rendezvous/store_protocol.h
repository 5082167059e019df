// The TCP store's wire format, parsed by pure functions so that every length
// is checked before it is used and the parsers can be fuzzed alone.
//
// On connect the server greets:  "RRS4", u8 flags (1: a token is required),
//                                16-byte server nonce
// the client answers:            16-byte client nonce, 32-byte proof
//                                HMAC(token, "rr-store-client" | nonces)
// the server replies:            u8 verdict (0: welcome, 1: refused),
//                                32-byte proof HMAC(token, "rr-store-server" | nonces),
//                                then its process (zeros when refused): u32 pid,
//                                u64 start time, 16-byte machine digest
//                                (common/process_state.h), so that a client on
//                                its machine can tell a stopped host from a slow
//                                one; told only to a client that proved the token
// Then:
//   request  = u8 command, u32 key length, key, u32 value length, value
//   response = u8 status (0 = ok, 1 = missing), u32 value length, value
//   command 4 (wait) is a get that the server holds until the key is set or
//   `value` (decimal milliseconds, at most kStoreMaxWaitMs) has passed: the
//   answer is then ok with the value, or missing. A waiting client sends
//   nothing else until it is answered (one request at a time, as always).
//   command 3 (set if absent) tells every other client the key's value when it
//   sets it, in a notice (how the ranks learn the first failure even once the
//   store's host is gone); command 5 (claim) is the same without the notice
//   (a seat, which nobody else reads).
//   notice   = u8 status 2, u32 length, key '\0' value
// Lengths are little-endian and bounded by kStoreMaxKey / kStoreMaxValue; a
// frame outside them is malformed and ends its connection.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/process_state.h"
#include "security/auth.h"

namespace rr {

constexpr size_t kStoreMaxKey = 1024;
constexpr size_t kStoreMaxValue = 4u << 20;
// The most a reply body can hold: a notice's key, separator and value.
constexpr size_t kStoreMaxBody = kStoreMaxKey + 1 + kStoreMaxValue;
constexpr size_t kStoreMaxRequest = 9 + kStoreMaxKey + kStoreMaxValue;

enum StoreCommand : uint8_t {
  kStoreSet = 1,
  kStoreGet = 2,
  kStoreSetIfAbsent = 3,
  kStoreWait = 4,
  kStoreClaim = 5,
};
constexpr int kStoreMaxWaitMs = 1000;
enum StoreStatus : uint8_t { kStoreOk = 0, kStoreMissing = 1, kStoreNotice = 2 };

enum class Parse { kNeedMore, kDone, kMalformed };

struct StoreRequest {
  uint8_t command = 0;
  std::string key;
  std::string value;
  int wait_ms = 0;  // kStoreWait: how long the server may hold it
};

// One request from the front of `in`. kDone: `*consumed` bytes made it.
// kMalformed: `*error` says why (an unknown command, a length over the limit,
// a wait that is not 0 to kStoreMaxWaitMs decimal milliseconds).
Parse parse_store_request(std::string_view in, StoreRequest* out, size_t* consumed,
                          std::string* error);

// One response or notice from the front of `in`, as parse_store_request.
Parse parse_store_reply(std::string_view in, uint8_t* status, std::string* body, size_t* consumed,
                        std::string* error);

// A notice's body is key '\0' value; false when it has no separator.
bool split_notice(std::string_view body, std::string* key, std::string* value);

std::string encode_store_request(uint8_t command, std::string_view key, std::string_view value);
std::string encode_store_reply(uint8_t status, std::string_view body);

// The handshake's frames.
constexpr char kStoreGreetingMagic[4] = {'R', 'R', 'S', '4'};
constexpr size_t kStoreGreetingBytes = 4 + 1 + 16;
constexpr size_t kStoreAnswerBytes = 16 + 32;
constexpr size_t kStoreProcessBytes = 4 + 8 + 16;
constexpr size_t kStoreVerdictBytes = 1 + 32 + kStoreProcessBytes;

struct StoreGreeting {
  bool token_required = false;
  Nonce nonce{};
};
std::string encode_greeting(const StoreGreeting& g);
// False (with *error) when `bytes` (kStoreGreetingBytes of them) is no greeting.
bool parse_greeting(std::string_view bytes, StoreGreeting* out, std::string* error);

// The verdict's process part: kStoreProcessBytes, any of which parse.
std::string encode_process(const ProcessName& p);
ProcessName parse_process(std::string_view bytes);

}  // namespace rr
