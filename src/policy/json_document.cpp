#include "policy/json_document.hpp"

#include <nlohmann/json.hpp>

#include <iterator>
#include <utility>

namespace actpage::policy {
namespace {

// Walks the text for nlohmann's input adapter and remembers how far the lexer has read. nlohmann
// reads one character at a time and fires each SAX event right after the token that carries it, so
// at every event the high-water mark is the end of that token (one character further for a number,
// whose end the lexer learns by reading the next character).
class CountingIterator {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;

  CountingIterator(const char* position, const char** high_water)
      : position_(position), high_water_(high_water) {}

  reference operator*() const { return *position_; }
  CountingIterator& operator++() {
    ++position_;
    if (position_ > *high_water_) *high_water_ = position_;
    return *this;
  }
  CountingIterator operator++(int) {
    CountingIterator before = *this;
    ++*this;
    return before;
  }
  friend bool operator==(const CountingIterator& a, const CountingIterator& b) {
    return a.position_ == b.position_;
  }

 private:
  const char* position_;
  const char** high_water_;
};

bool is_number_char(char c) {
  return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E';
}

// Builds JsonValues from SAX events: containers under construction are on a stack and move into
// their parent when they close, so no pointer into a growing vector is ever held.
class DocumentBuilder {
 public:
  using json = nlohmann::json;

  DocumentBuilder(std::string_view text, const char* const* high_water)
      : text_(text), high_water_(high_water) {}

  bool null() { return add(make(JsonValue::Type::null, literal_start(4))); }
  bool boolean(bool value) {
    JsonValue v = make(JsonValue::Type::boolean, literal_start(value ? 4 : 5));
    v.boolean = value;
    return add(std::move(v));
  }
  bool number_integer(json::number_integer_t value) {
    JsonValue v = make(JsonValue::Type::integer, number_start());
    v.integer = value;
    return add(std::move(v));
  }
  bool number_unsigned(json::number_unsigned_t value) {
    JsonValue v = make(JsonValue::Type::unsigned_integer, number_start());
    v.unsigned_integer = value;
    return add(std::move(v));
  }
  bool number_float(json::number_float_t value, const json::string_t& as_written) {
    JsonValue v = make(JsonValue::Type::floating, number_start());
    v.floating = value;
    v.text = as_written;
    return add(std::move(v));
  }
  bool string(json::string_t& value) {
    JsonValue v = make(JsonValue::Type::string, string_start());
    v.text = std::move(value);
    return add(std::move(v));
  }
  bool binary(json::binary_t& /*value*/) { return false; }  // JSON text has no binary values

  bool start_object(std::size_t /*elements*/) { return open(JsonValue::Type::object); }
  bool key(json::string_t& name) {
    stack_.back().key = std::move(name);
    stack_.back().key_offset = string_start();
    return true;
  }
  bool end_object() { return close(); }
  bool start_array(std::size_t /*elements*/) { return open(JsonValue::Type::array); }
  bool end_array() { return close(); }

  bool parse_error(std::size_t position, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& error) {
    // `position` counts the characters read, the offending one included.
    error_ = error.what();
    error_offset_ = token_start(position > 0 ? position - 1 : 0, error_);
    // Drop nlohmann's "[json.exception.parse_error.101] parse error at line 1, column 5: " prefix:
    // the caller prints its own file:line:column.
    const std::size_t column = error_.find("column ");
    const std::size_t colon = column == std::string::npos ? column : error_.find(": ", column);
    if (colon != std::string::npos) error_.erase(0, colon + 2);
    return false;
  }

  JsonParseResult finish(bool parsed) {
    JsonParseResult result;
    if (parsed && root_) {
      result.document = std::move(root_);
    } else {
      result.error_offset = error_offset_ < text_.size() ? error_offset_ : text_.size();
      result.error = error_.empty() ? "invalid JSON" : error_;
    }
    return result;
  }

 private:
  struct Frame {
    JsonValue value;
    std::string key;  // the key whose value comes next (objects)
    std::size_t key_offset = 0;
  };

  std::size_t end() const { return static_cast<std::size_t>(*high_water_ - text_.data()); }

  std::size_t literal_start(std::size_t length) const { return end() >= length ? end() - length : 0; }

  // The lexer has read one character past the number, except at the end of the text.
  std::size_t number_start() const {
    if (end() == 0) return 0;
    std::size_t i = end() - 1;
    if (i > 0 && !is_number_char(text_[i])) --i;
    while (i > 0 && is_number_char(text_[i - 1])) --i;
    return i;
  }

  // The lexer stopped right after the closing quote; the opening quote is the nearest quote before
  // it that is not escaped (preceded by an even number of backslashes).
  std::size_t string_start() const { return end() < 2 ? 0 : opening_quote(end() - 1); }

  std::size_t opening_quote(std::size_t closing_quote) const {
    for (std::size_t i = closing_quote; i-- > 0;) {
      if (text_[i] != '"') continue;
      std::size_t backslashes = 0;
      while (backslashes < i && text_[i - 1 - backslashes] == '\\') ++backslashes;
      if (backslashes % 2 == 0) return i;
    }
    return 0;
  }

  // nlohmann reports a token the grammar did not expect ("unexpected string literal") at its last
  // character; people look for where it starts. Other errors (a bad character) stay where they are.
  std::size_t token_start(std::size_t last_char, std::string_view message) const {
    if (last_char >= text_.size()) return last_char;
    if (message.find("unexpected string literal") != std::string_view::npos && text_[last_char] == '"') {
      return opening_quote(last_char);
    }
    if (message.find("unexpected number literal") != std::string_view::npos) {
      std::size_t i = last_char;
      while (i > 0 && is_number_char(text_[i - 1])) --i;
      return i;
    }
    for (std::string_view literal : {"true", "false", "null"}) {
      const std::string expected = "unexpected " + std::string(literal) + " literal";
      if (message.find(expected) != std::string_view::npos && last_char + 1 >= literal.size()) {
        return last_char + 1 - literal.size();
      }
    }
    return last_char;
  }

  static JsonValue make(JsonValue::Type type, std::size_t offset) {
    JsonValue v;
    v.type = type;
    v.offset = offset;
    return v;
  }

  bool open(JsonValue::Type type) {
    if (stack_.size() >= kMaxDepth) {
      error_offset_ = end() > 0 ? end() - 1 : 0;
      error_ = "nested more than " + std::to_string(kMaxDepth) + " levels deep";
      return false;
    }
    Frame frame;
    frame.value = make(type, end() > 0 ? end() - 1 : 0);
    stack_.push_back(std::move(frame));
    return true;
  }

  bool close() {
    JsonValue done = std::move(stack_.back().value);
    stack_.pop_back();
    return add(std::move(done));
  }

  bool add(JsonValue value) {
    if (stack_.empty()) {
      root_ = std::move(value);
      return true;
    }
    Frame& parent = stack_.back();
    if (parent.value.type == JsonValue::Type::object) {
      parent.value.members.push_back(JsonMember{std::move(parent.key), parent.key_offset, std::move(value)});
    } else {
      parent.value.elements.push_back(std::move(value));
    }
    return true;
  }

  std::string_view text_;
  const char* const* high_water_;
  std::vector<Frame> stack_;
  std::optional<JsonValue> root_;
  std::size_t error_offset_ = 0;
  std::string error_;
};

std::string shortened(const std::string& text) {
  constexpr std::size_t kLongest = 40;
  if (text.size() <= kLongest) return text;
  return text.substr(0, kLongest) + "...";
}

}  // namespace

std::string JsonValue::describe() const {
  switch (type) {
    case Type::null: return "null";
    case Type::boolean: return boolean ? "true" : "false";
    case Type::integer: return "the number " + std::to_string(integer);
    case Type::unsigned_integer: return "the number " + std::to_string(unsigned_integer);
    case Type::floating: return "the number " + text;
    case Type::string: return "the string \"" + shortened(text) + "\"";
    case Type::object: return "an object";
    case Type::array: return "an array";
  }
  return "a value";
}

JsonParseResult parse_json_document(std::string_view text) {
  const char* high_water = text.data();
  DocumentBuilder builder(text, &high_water);
  const bool parsed = nlohmann::json::sax_parse(CountingIterator(text.data(), &high_water),
                                                CountingIterator(text.data() + text.size(), &high_water),
                                                &builder, nlohmann::json::input_format_t::json,
                                                /*strict=*/true, /*ignore_comments=*/false);
  return builder.finish(parsed);
}

TextPosition position_of(std::string_view text, std::size_t offset) {
  if (offset > text.size()) offset = text.size();
  TextPosition position{1, 1};
  std::size_t line_start = 0;
  for (std::size_t i = 0; i < offset; ++i) {
    if (text[i] == '\n') {
      ++position.line;
      line_start = i + 1;
    }
  }
  position.column = static_cast<int>(offset - line_start) + 1;
  return position;
}

}  // namespace actpage::policy
