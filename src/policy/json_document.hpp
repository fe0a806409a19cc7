// A JSON document read together with the byte offset of every key and value.
//
// Why not nlohmann::json directly: a policy's semantic errors ("host_pool.bytes: a size cannot be
// negative") should point at line:column like its syntax errors do, and nlohmann 3.11's DOM keeps no
// positions. parse_json_document() runs nlohmann's SAX parser over the text and records where each
// token is. It also keeps duplicate keys (in document order) so the policy loader can reject them.
//
// Contract: never throws (other than std::bad_alloc); a document nested deeper than kMaxDepth is
// refused as an error rather than risking deep recursion later.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace actpage::policy {

struct JsonMember;

struct JsonValue {
  enum class Type { null, boolean, integer, unsigned_integer, floating, string, object, array };

  Type type = Type::null;
  std::size_t offset = 0;             // byte offset of the value's first character in the text
  bool boolean = false;
  std::int64_t integer = 0;           // written with a '-' (nlohmann's number_integer)
  std::uint64_t unsigned_integer = 0; // written without a sign
  double floating = 0;                // written with a fraction or exponent, or too large for 64 bits
  std::string text;                   // a string's value; a floating number as written
  std::vector<JsonMember> members;    // object members in document order, duplicates kept
  std::vector<JsonValue> elements;    // array elements

  bool is_number() const {
    return type == Type::integer || type == Type::unsigned_integer || type == Type::floating;
  }
  // What a type error says it found: "the string \"yes\"", "the number -3", "an object", "null".
  std::string describe() const;
};

struct JsonMember {
  std::string key;
  std::size_t key_offset = 0;  // offset of the key's opening quote
  JsonValue value;
};

struct JsonParseResult {
  std::optional<JsonValue> document;  // set when the text is one valid JSON value
  std::size_t error_offset = 0;       // otherwise: where the parser stopped
  std::string error;                  // and why ("syntax error while parsing object - ...")
};

inline constexpr std::size_t kMaxDepth = 64;

JsonParseResult parse_json_document(std::string_view text);

// 1-based line and column (in bytes) of a byte offset; an offset past the end is the end.
struct TextPosition {
  int line = 0;
  int column = 0;
};
TextPosition position_of(std::string_view text, std::size_t offset);

}  // namespace actpage::policy
