#include "rendezvous/store_protocol.h"

#include <algorithm>
#include <cstring>

namespace rr {
namespace {

uint32_t read_u32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

void append_u32(std::string& out, uint32_t v) { out.append(reinterpret_cast<char*>(&v), 4); }

}  // namespace

Parse parse_store_request(std::string_view in, StoreRequest* out, size_t* consumed,
                          std::string* error) {
  if (in.empty()) return Parse::kNeedMore;
  const uint8_t command = static_cast<uint8_t>(in[0]);
  if (command < kStoreSet || command > kStoreClaim) {
    *error = "unknown command " + std::to_string(command);
    return Parse::kMalformed;
  }
  if (in.size() < 5) return Parse::kNeedMore;
  const uint32_t klen = read_u32(in.data() + 1);
  if (klen > kStoreMaxKey) {
    *error =
        "key of " + std::to_string(klen) + " bytes (limit " + std::to_string(kStoreMaxKey) + ")";
    return Parse::kMalformed;
  }
  // Both lengths are bounded, so these sums cannot wrap.
  if (in.size() < 9 + size_t{klen}) return Parse::kNeedMore;
  const uint32_t vlen = read_u32(in.data() + 5 + klen);
  if (vlen > kStoreMaxValue) {
    *error = "value of " + std::to_string(vlen) + " bytes (limit " +
             std::to_string(kStoreMaxValue) + ")";
    return Parse::kMalformed;
  }
  const size_t total = 9 + size_t{klen} + size_t{vlen};
  if (in.size() < total) return Parse::kNeedMore;
  const std::string_view value = in.substr(9 + klen, vlen);
  if (command == kStoreWait) {
    // Decimal milliseconds: 1 to 4 digits, and no more than the limit.
    int ms = 0;
    const bool digits =
        !value.empty() && value.size() <= 4 &&
        std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (digits) {
      for (char c : value) ms = ms * 10 + (c - '0');
    }
    if (!digits || ms > kStoreMaxWaitMs) {
      *error = "a wait of '" + std::string(value.substr(0, 16)) + "' (0 to " +
               std::to_string(kStoreMaxWaitMs) + " decimal milliseconds)";
      return Parse::kMalformed;
    }
    out->wait_ms = ms;
  }
  out->command = command;
  out->key.assign(in.data() + 5, klen);
  out->value.assign(value.data(), value.size());
  *consumed = total;
  return Parse::kDone;
}

Parse parse_store_reply(std::string_view in, uint8_t* status, std::string* body, size_t* consumed,
                        std::string* error) {
  if (in.empty()) return Parse::kNeedMore;
  const uint8_t s = static_cast<uint8_t>(in[0]);
  if (s > kStoreNotice) {
    *error = "unknown status " + std::to_string(s);
    return Parse::kMalformed;
  }
  if (in.size() < 5) return Parse::kNeedMore;
  const uint32_t len = read_u32(in.data() + 1);
  if (len > kStoreMaxBody) {
    *error =
        "reply of " + std::to_string(len) + " bytes (limit " + std::to_string(kStoreMaxBody) + ")";
    return Parse::kMalformed;
  }
  if (in.size() < 5 + size_t{len}) return Parse::kNeedMore;
  *status = s;
  body->assign(in.data() + 5, len);
  *consumed = 5 + size_t{len};
  return Parse::kDone;
}

bool split_notice(std::string_view body, std::string* key, std::string* value) {
  const size_t split = body.find('\0');
  if (split == std::string_view::npos || split > kStoreMaxKey) return false;
  key->assign(body.substr(0, split));
  value->assign(body.substr(split + 1));
  return true;
}

std::string encode_store_request(uint8_t command, std::string_view key, std::string_view value) {
  std::string msg(1, static_cast<char>(command));
  append_u32(msg, static_cast<uint32_t>(key.size()));
  msg += key;
  append_u32(msg, static_cast<uint32_t>(value.size()));
  msg += value;
  return msg;
}

std::string encode_store_reply(uint8_t status, std::string_view body) {
  std::string out(1, static_cast<char>(status));
  append_u32(out, static_cast<uint32_t>(body.size()));
  out += body;
  return out;
}

std::string encode_greeting(const StoreGreeting& g) {
  std::string out(kStoreGreetingMagic, 4);
  out.push_back(g.token_required ? 1 : 0);
  out += bytes_of(g.nonce);
  return out;
}

bool parse_greeting(std::string_view bytes, StoreGreeting* out, std::string* error) {
  if (bytes.size() != kStoreGreetingBytes ||
      std::memcmp(bytes.data(), kStoreGreetingMagic, 4) != 0) {
    *error = "not a ringreduce store (or one of another version)";
    return false;
  }
  const uint8_t flags = static_cast<uint8_t>(bytes[4]);
  if (flags > 1) {
    *error = "unknown store flags " + std::to_string(flags);
    return false;
  }
  out->token_required = flags == 1;
  std::memcpy(out->nonce.data(), bytes.data() + 5, out->nonce.size());
  return true;
}

std::string encode_process(const ProcessName& p) {
  std::string out;
  append_u32(out, p.pid);
  out.append(reinterpret_cast<const char*>(&p.start), 8);
  out.append(reinterpret_cast<const char*>(p.machine.data()), p.machine.size());
  return out;
}

ProcessName parse_process(std::string_view bytes) {
  ProcessName p;
  if (bytes.size() != kStoreProcessBytes) return p;
  p.pid = read_u32(bytes.data());
  std::memcpy(&p.start, bytes.data() + 4, 8);
  std::memcpy(p.machine.data(), bytes.data() + 12, p.machine.size());
  return p;
}

}  // namespace rr
