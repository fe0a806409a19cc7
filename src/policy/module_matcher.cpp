#include "policy/module_matcher.hpp"

#include <bitset>
#include <limits>

namespace actpage::policy {

// One element of a compiled glob. Literal runs are kept whole so that matching compares strings.
struct Glob::Token {
  enum class Kind { literal, any_char, star, char_class, number };
  Kind kind = Kind::literal;
  std::string literal;           // Kind::literal
  std::bitset<256> chars;        // Kind::char_class, negation already applied
  std::uint64_t low = 0;         // Kind::number: a whole decimal number in [low, high]
  std::uint64_t high = 0;
};

namespace {

using Token = Glob::Token;
using TokenList = std::vector<std::shared_ptr<const Glob::Token>>;
constexpr std::size_t kNoMatch = std::string_view::npos;

bool is_digit(char c) { return c >= '0' && c <= '9'; }

bool fail(std::string* why, std::string reason) {
  if (why != nullptr) *why = std::move(reason);
  return false;
}

// "[0-13]": both bounds decimal and at least one of them longer than a digit. "[0-9]" stays a
// character class: as a number range it would mean the same for one digit and surprise for two.
bool looks_numeric(std::string_view body) {
  const std::size_t dash = body.find('-');
  if (dash == std::string_view::npos || dash == 0 || dash + 1 == body.size()) return false;
  for (std::size_t i = 0; i < body.size(); ++i) {
    if (i != dash && !is_digit(body[i])) return false;
  }
  return dash > 1 || body.size() - dash - 1 > 1;
}

bool parse_bound(std::string_view digits, std::uint64_t& value) {
  value = 0;
  for (char c : digits) {
    const auto digit = static_cast<std::uint64_t>(c - '0');
    if (value > (std::numeric_limits<std::uint64_t>::max() - digit) / 10) return false;
    value = value * 10 + digit;
  }
  return true;
}

// Parses the bracket expression starting at pattern[open] == '['. On success sets `token` and
// `next` (the index after the closing ']').
bool parse_bracket(std::string_view pattern, std::size_t open, Token& token, std::size_t& next,
                   std::string* why) {
  // Find the closing bracket first: escapes and a ']' right after '[' (or '[!', '[^') are members.
  std::size_t i = open + 1;
  if (i < pattern.size() && (pattern[i] == '!' || pattern[i] == '^')) ++i;
  const std::size_t members_begin = i;
  if (i < pattern.size() && pattern[i] == ']') ++i;
  while (i < pattern.size() && pattern[i] != ']') {
    if (pattern[i] == '\\') ++i;
    ++i;
  }
  if (i >= pattern.size()) {
    return fail(why, "unterminated '[' at offset " + std::to_string(open));
  }
  const std::size_t close = i;
  next = close + 1;

  const std::string_view body = pattern.substr(open + 1, close - open - 1);
  if (looks_numeric(body)) {
    const std::size_t dash = body.find('-');
    std::uint64_t low = 0;
    std::uint64_t high = 0;
    if (!parse_bound(body.substr(0, dash), low) || !parse_bound(body.substr(dash + 1), high)) {
      return fail(why, "numeric range [" + std::string(body) + "] has a bound above 2^64-1");
    }
    if (low > high) return fail(why, "reversed numeric range [" + std::string(body) + "]");
    token.kind = Token::Kind::number;
    token.low = low;
    token.high = high;
    return true;
  }

  token.kind = Token::Kind::char_class;
  const bool negated = members_begin != open + 1;
  // Reads one member character at j, honouring escapes; returns it and advances j.
  auto member_at = [&](std::size_t& j) -> unsigned char {
    if (pattern[j] == '\\') ++j;
    return static_cast<unsigned char>(pattern[j++]);
  };
  std::size_t j = members_begin;
  while (j < close) {
    const unsigned char first = member_at(j);
    if (j + 1 < close && pattern[j] == '-') {
      ++j;  // the dash
      const unsigned char last = member_at(j);
      if (last < first) {
        return fail(why, "reversed character range in [" + std::string(body) + "]");
      }
      for (unsigned c = first; c <= last; ++c) token.chars.set(c);
    } else {
      token.chars.set(first);
    }
  }
  if (negated) token.chars.flip();
  return true;
}

// Matches tokens [first, last), none of them a star, at text[pos...]; returns the end or kNoMatch.
std::size_t match_segment(const TokenList& tokens, std::size_t first, std::size_t last, std::string_view text,
                          std::size_t pos) {
  for (std::size_t t = first; t < last; ++t) {
    const Token& token = *tokens[t];
    switch (token.kind) {
      case Token::Kind::literal:
        if (text.substr(pos, token.literal.size()) != token.literal) return kNoMatch;
        pos += token.literal.size();
        break;
      case Token::Kind::any_char:
        if (pos >= text.size()) return kNoMatch;
        ++pos;
        break;
      case Token::Kind::char_class:
        if (pos >= text.size() || !token.chars.test(static_cast<unsigned char>(text[pos]))) return kNoMatch;
        ++pos;
        break;
      case Token::Kind::number: {
        // A whole number: starts and ends at a digit boundary, so "[0-13]" never matches the "13"
        // inside "130" or the "3" of "13".
        if (pos >= text.size() || !is_digit(text[pos]) || (pos > 0 && is_digit(text[pos - 1]))) return kNoMatch;
        std::uint64_t value = 0;
        bool overflow = false;
        while (pos < text.size() && is_digit(text[pos])) {
          const auto digit = static_cast<std::uint64_t>(text[pos] - '0');
          if (value > (std::numeric_limits<std::uint64_t>::max() - digit) / 10) overflow = true;
          if (!overflow) value = value * 10 + digit;
          ++pos;
        }
        if (overflow || value < token.low || value > token.high) return kNoMatch;
        break;
      }
      case Token::Kind::star:
        return kNoMatch;  // callers split at stars
    }
  }
  return pos;
}

std::size_t next_star(const TokenList& tokens, std::size_t from) {
  while (from < tokens.size() && tokens[from]->kind != Token::Kind::star) ++from;
  return from;
}

}  // namespace

std::string Glob::literal(std::string_view name) {
  std::string pattern;
  for (char c : name) {
    if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') pattern += '\\';
    pattern += c;
  }
  return pattern;
}

std::optional<Glob> Glob::compile(std::string_view pattern, std::string* why) {
  Glob glob;
  glob.pattern_ = std::string(pattern);
  std::string literal;
  auto flush_literal = [&] {
    if (literal.empty()) return;
    auto token = std::make_shared<Token>();
    token->kind = Token::Kind::literal;
    token->literal = std::move(literal);
    literal.clear();
    glob.tokens_.push_back(std::move(token));
  };
  std::size_t i = 0;
  while (i < pattern.size()) {
    const char c = pattern[i];
    if (c == '\\') {
      if (i + 1 == pattern.size()) {
        fail(why, "'\\' at the end escapes nothing");
        return std::nullopt;
      }
      literal += pattern[i + 1];
      i += 2;
    } else if (c == '*') {
      flush_literal();
      // "**" means the same as "*"; keeping one makes star_count() and matching simpler.
      if (glob.tokens_.empty() || glob.tokens_.back()->kind != Token::Kind::star) {
        auto token = std::make_shared<Token>();
        token->kind = Token::Kind::star;
        glob.tokens_.push_back(std::move(token));
      }
      ++i;
    } else if (c == '?') {
      flush_literal();
      auto token = std::make_shared<Token>();
      token->kind = Token::Kind::any_char;
      glob.tokens_.push_back(std::move(token));
      ++i;
    } else if (c == '[') {
      flush_literal();
      auto token = std::make_shared<Token>();
      std::size_t next = 0;
      if (!parse_bracket(pattern, i, *token, next, why)) return std::nullopt;
      glob.tokens_.push_back(std::move(token));
      i = next;
    } else {
      literal += c;
      ++i;
    }
  }
  flush_literal();
  return glob;
}

std::size_t Glob::star_count() const {
  std::size_t stars = 0;
  for (const auto& token : tokens_) stars += token->kind == Token::Kind::star ? 1 : 0;
  return stars;
}

bool Glob::matches(std::string_view text) const {
  // Segments between stars hold only fixed or self-delimiting tokens, so each matches at a given
  // position in at most one way, and a later start never ends earlier. Taking the earliest match of
  // each middle segment is therefore enough; only the last one must end exactly at the end.
  std::size_t segment_end = next_star(tokens_, 0);
  std::size_t pos = match_segment(tokens_, 0, segment_end, text, 0);
  if (pos == kNoMatch) return false;
  if (segment_end == tokens_.size()) return pos == text.size();
  std::size_t segment_begin = segment_end + 1;
  while (true) {
    segment_end = next_star(tokens_, segment_begin);
    if (segment_end == tokens_.size()) {
      if (segment_begin == segment_end) return true;  // a trailing star takes the rest
      for (std::size_t start = pos; start <= text.size(); ++start) {
        if (match_segment(tokens_, segment_begin, segment_end, text, start) == text.size()) return true;
      }
      return false;
    }
    std::size_t end = kNoMatch;
    for (std::size_t start = pos; start <= text.size() && end == kNoMatch; ++start) {
      end = match_segment(tokens_, segment_begin, segment_end, text, start);
    }
    if (end == kNoMatch) return false;
    pos = end;
    segment_begin = segment_end + 1;
  }
}

std::optional<std::string_view> Glob::star_match(std::string_view text) const {
  if (star_count() != 1) return std::nullopt;
  const std::size_t star = next_star(tokens_, 0);
  const std::size_t begin = match_segment(tokens_, 0, star, text, 0);
  if (begin == kNoMatch) return std::nullopt;
  // The longest text for the star: try the suffix's start from the far end.
  for (std::size_t start = text.size() + 1; start-- > begin;) {
    if (match_segment(tokens_, star + 1, tokens_.size(), text, start) == text.size()) {
      return text.substr(begin, start - begin);
    }
  }
  return std::nullopt;
}

ModuleMatcher::ModuleMatcher(const Options& options) {
  rules_.reserve(options.modules.size());
  for (const ModuleRule& rule : options.modules) {
    CompiledRule compiled{{}, rule.offload, rule.min_bytes.value_or(options.min_bytes)};
    for (const std::string& pattern : rule.match) {
      // Options are validated by policy::load(); a glob that does not compile cannot get here, and
      // skipping it is the safe reading if it somehow did.
      if (auto glob = Glob::compile(pattern)) compiled.globs.push_back(std::move(*glob));
    }
    rules_.push_back(std::move(compiled));
  }
  for (const std::string& pattern : options.backward_ranges) {
    auto glob = Glob::compile(pattern);
    if (glob && glob->star_count() == 1) backward_.push_back(std::move(*glob));
  }
}

std::optional<RuleMatch> ModuleMatcher::match(std::string_view range_name) const {
  for (std::size_t i = 0; i < rules_.size(); ++i) {
    for (const Glob& glob : rules_[i].globs) {
      if (glob.matches(range_name)) return RuleMatch{i, rules_[i].offload, rules_[i].min_bytes};
    }
  }
  return std::nullopt;
}

std::optional<std::string> ModuleMatcher::backward_module(std::string_view range_name) const {
  for (const Glob& glob : backward_) {
    const auto module = glob.star_match(range_name);
    if (module && !module->empty()) return std::string(*module);
  }
  return std::nullopt;
}

}  // namespace actpage::policy
