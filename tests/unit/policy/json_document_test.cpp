#include "policy/json_document.hpp"

#include <gtest/gtest.h>

#include <string>

namespace actpage::policy {
namespace {

TEST(PositionOf, LinesAndColumnsAreOneBased) {
  const std::string text = "ab\ncd\n\nef";
  EXPECT_EQ(position_of(text, 0).line, 1);
  EXPECT_EQ(position_of(text, 0).column, 1);
  EXPECT_EQ(position_of(text, 1).column, 2);
  EXPECT_EQ(position_of(text, 3).line, 2);
  EXPECT_EQ(position_of(text, 3).column, 1);
  EXPECT_EQ(position_of(text, 7).line, 4);
  EXPECT_EQ(position_of(text, 8).column, 2);
  EXPECT_EQ(position_of(text, 100).line, 4);  // past the end: the end
  EXPECT_EQ(position_of(text, 100).column, 3);
}

// The offset recorded for each key and value is where that token starts in the text.
TEST(ParseJsonDocument, RecordsWhereEveryKeyAndValueStarts) {
  const std::string text =
      "{\n"
      "  \"version\": 1,\n"
      "  \"a\\\"b\\\\\": \"x\\\\\",\n"
      "  \"n\": [-3, 2.5e3,true,null, false , 18446744073709551616],\n"
      "  \"o\" : { \"k\":\"v\" }\n"
      "}";
  const auto parsed = parse_json_document(text);
  ASSERT_TRUE(parsed.document) << parsed.error;
  const JsonValue& root = *parsed.document;
  ASSERT_EQ(root.type, JsonValue::Type::object);
  EXPECT_EQ(root.offset, 0u);
  ASSERT_EQ(root.members.size(), 4u);

  auto expect_at = [&](std::size_t offset, std::string_view token) {
    EXPECT_EQ(text.substr(offset, token.size()), token) << "offset " << offset;
  };
  expect_at(root.members[0].key_offset, "\"version\"");
  expect_at(root.members[0].value.offset, "1,");
  EXPECT_EQ(root.members[1].key, "a\"b\\");
  expect_at(root.members[1].key_offset, "\"a\\\"b");
  EXPECT_EQ(root.members[1].value.text, "x\\");
  expect_at(root.members[1].value.offset, "\"x\\\\\"");

  const JsonValue& n = root.members[2].value;
  ASSERT_EQ(n.type, JsonValue::Type::array);
  expect_at(n.offset, "[-3");
  ASSERT_EQ(n.elements.size(), 6u);
  EXPECT_EQ(n.elements[0].type, JsonValue::Type::integer);
  EXPECT_EQ(n.elements[0].integer, -3);
  expect_at(n.elements[0].offset, "-3,");
  EXPECT_EQ(n.elements[1].type, JsonValue::Type::floating);
  EXPECT_EQ(n.elements[1].text, "2.5e3");
  expect_at(n.elements[1].offset, "2.5e3");
  expect_at(n.elements[2].offset, "true");
  expect_at(n.elements[3].offset, "null");
  expect_at(n.elements[4].offset, "false");
  EXPECT_EQ(n.elements[5].type, JsonValue::Type::floating);  // beyond 64 bits
  expect_at(n.elements[5].offset, "18446744073709551616]");

  const JsonValue& o = root.members[3].value;
  expect_at(root.members[3].key_offset, "\"o\" :");
  expect_at(o.offset, "{ \"k\"");
  ASSERT_EQ(o.members.size(), 1u);
  expect_at(o.members[0].value.offset, "\"v\"");

  EXPECT_EQ(position_of(text, n.elements[1].offset).line, 4);
  EXPECT_EQ(position_of(text, n.elements[1].offset).column, 13);
}

TEST(ParseJsonDocument, KeepsDuplicateKeysInOrder) {
  const auto parsed = parse_json_document(R"({"a": 1, "a": 2})");
  ASSERT_TRUE(parsed.document);
  ASSERT_EQ(parsed.document->members.size(), 2u);
  EXPECT_EQ(parsed.document->members[0].value.unsigned_integer, 1u);
  EXPECT_EQ(parsed.document->members[1].value.unsigned_integer, 2u);
}

TEST(ParseJsonDocument, ScalarDocuments) {
  const auto number = parse_json_document("42");
  ASSERT_TRUE(number.document);
  EXPECT_EQ(number.document->unsigned_integer, 42u);
  EXPECT_EQ(number.document->offset, 0u);
  const auto text = parse_json_document("  \"s\"");
  ASSERT_TRUE(text.document);
  EXPECT_EQ(text.document->offset, 2u);
}

struct SyntaxCase {
  const char* text;
  int line;
  int column;
  const char* message_part;
};

class ParseJsonDocumentSyntaxError : public ::testing::TestWithParam<SyntaxCase> {};

TEST_P(ParseJsonDocumentSyntaxError, PointsAtTheOffendingCharacter) {
  const std::string text = GetParam().text;
  const auto parsed = parse_json_document(text);
  ASSERT_FALSE(parsed.document);
  const TextPosition at = position_of(text, parsed.error_offset);
  EXPECT_EQ(at.line, GetParam().line) << parsed.error;
  EXPECT_EQ(at.column, GetParam().column) << parsed.error;
  EXPECT_NE(parsed.error.find(GetParam().message_part), std::string::npos) << parsed.error;
  EXPECT_EQ(parsed.error.find("[json.exception"), std::string::npos) << "nlohmann's prefix is dropped";
}

INSTANTIATE_TEST_SUITE_P(
    Table, ParseJsonDocumentSyntaxError,
    ::testing::Values(SyntaxCase{"{\n  \"version\": 1,\n  \"mode\": \"offload\",,\n}", 3, 21, "unexpected ','"},
                      // An unexpected token is reported where it starts.
                      SyntaxCase{"{\n  \"a\": 1\n  \"b\": 2\n}", 3, 3, "unexpected string literal; expected '}'"},
                      SyntaxCase{"{\"a\\\"\": 1 \"b\\\"x\": 2}", 1, 11, "unexpected string literal"},
                      SyntaxCase{"{\"a\": 1 234}", 1, 9, "unexpected number literal"},
                      SyntaxCase{"{\"a\": 1 false}", 1, 9, "unexpected false literal"},
                      SyntaxCase{"[1 null]", 1, 4, "unexpected null literal"},
                      SyntaxCase{"{\"a\" 1}", 1, 6, "unexpected number literal; expected ':'"},
                      SyntaxCase{"{\"a\": tru}", 1, 10, "invalid literal"},
                      SyntaxCase{"{\"a\": 1", 1, 8, "unexpected end of input"},
                      SyntaxCase{"", 1, 1, "unexpected end of input"}, SyntaxCase{"{} x", 1, 4, "expected end of input"},
                      SyntaxCase{"{\"a\": 1,}", 1, 9, "expected string literal"},
                      SyntaxCase{"{\"a\": \"b\nc\"}", 1, 9, "control character"},
                      SyntaxCase{"// comment\n{}", 1, 1, "invalid literal"}));

TEST(ParseJsonDocument, RefusesDeepNesting) {
  const std::string deep = std::string(kMaxDepth + 1, '[') + std::string(kMaxDepth + 1, ']');
  const auto parsed = parse_json_document(deep);
  ASSERT_FALSE(parsed.document);
  EXPECT_NE(parsed.error.find("nested more than"), std::string::npos);
  EXPECT_EQ(parsed.error_offset, kMaxDepth);

  const std::string ok = std::string(kMaxDepth, '[') + std::string(kMaxDepth, ']');
  EXPECT_TRUE(parse_json_document(ok).document);
}

TEST(JsonValue, DescribeSaysWhatWasFound) {
  const auto parsed = parse_json_document(R"([null, true, -3, 7, 2.50, "yes", {}, []])");
  ASSERT_TRUE(parsed.document);
  const auto& e = parsed.document->elements;
  EXPECT_EQ(e[0].describe(), "null");
  EXPECT_EQ(e[1].describe(), "true");
  EXPECT_EQ(e[2].describe(), "the number -3");
  EXPECT_EQ(e[3].describe(), "the number 7");
  EXPECT_EQ(e[4].describe(), "the number 2.50");
  EXPECT_EQ(e[5].describe(), "the string \"yes\"");
  EXPECT_EQ(e[6].describe(), "an object");
  EXPECT_EQ(e[7].describe(), "an array");
}

}  // namespace
}  // namespace actpage::policy
