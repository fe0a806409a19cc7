// What the range stack and the registry write into a trace: RANGE_PUSH/RANGE_POP with the node and
// the domain, NAME and PATH definitions (once each, backward markers flagged), read back with the
// trace reader.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "ranges/registry.hpp"
#include "ranges/trace_definitions.hpp"
#include "trace/reader.hpp"
#include "trace/writer.hpp"

namespace actpage::ranges {
namespace {

class TraceRecordsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/actpage-ranges-XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    trace::WriterConfig config;
    config.path = (dir_ / "ranges.trace").string();
    config.flush_interval_ms = 600000;
    auto opened = trace::Writer::open(config);
    ASSERT_TRUE(opened.ok()) << opened.status().message();
    writer_ = std::move(opened).value();
    trace::set_active(writer_.get());
  }
  void TearDown() override {
    stop_defining_in_trace();
    trace::set_active(nullptr);
    if (writer_) writer_->close();
    while (depth() > 0) pop();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  trace::TraceFile read_back() {
    writer_->close();
    auto read = trace::read_trace_file(writer_->path());
    EXPECT_TRUE(read.ok()) << read.status().message();
    return std::move(read).value();
  }

  std::filesystem::path dir_;
  std::unique_ptr<trace::Writer> writer_;
};

TEST_F(TraceRecordsTest, PushAndPopAreRecordedWithTheirNodeAndDomain) {
  Registry& registry = Registry::instance();
  define_in_trace(nullptr);
  const NameId domain = registry.intern_name("trace_records_test.domain");
  push(registry.intern_name("trace_records_test.outer"));
  const PathId outer = current();
  push(registry.intern_name("trace_records_test.inner"), domain);
  const PathId inner = current();
  pop();
  pop();

  const trace::TraceFile file = read_back();
  ASSERT_EQ(file.ranges.size(), 4u);
  EXPECT_EQ(file.ranges[0].type, trace::RecordType::range_push);
  EXPECT_EQ(file.ranges[0].data.path_id, outer);
  EXPECT_EQ(file.ranges[0].data.domain, 0u);
  EXPECT_EQ(file.ranges[1].data.path_id, inner);
  EXPECT_EQ(file.ranges[1].data.domain, domain);
  EXPECT_EQ(file.ranges[2].type, trace::RecordType::range_pop);
  EXPECT_EQ(file.ranges[2].data.path_id, inner);
  EXPECT_EQ(file.ranges[2].data.domain, domain);
  EXPECT_EQ(file.ranges[3].data.path_id, outer);
  EXPECT_EQ(file.path_string(inner), "trace_records_test.outer/trace_records_test.inner");
  EXPECT_EQ(file.name(domain), "trace_records_test.domain");
}

TEST_F(TraceRecordsTest, EveryNameAndPathIsDefinedExactlyOnceEvenWhenCreatedBeforeTheTrace) {
  Registry& registry = Registry::instance();
  // Created before the trace's definitions are switched on: replayed into the file.
  const NameId early = registry.intern_name("trace_records_test.early");
  const PathId early_node = registry.child(kNoPath, early);
  define_in_trace(nullptr);
  const NameId late = registry.intern_name("trace_records_test.late");
  push(late);
  pop();
  push(late);  // known node: no second definition
  pop();

  const trace::TraceFile file = read_back();
  EXPECT_EQ(file.name(early), "trace_records_test.early");
  EXPECT_EQ(file.name(late), "trace_records_test.late");
  EXPECT_EQ(file.path_string(early_node), "trace_records_test.early");
  // The reader keeps one entry per id; count the definitions through the record total instead.
  EXPECT_EQ(file.names.size(), registry.name_count());
  EXPECT_EQ(file.path_nodes.size(), registry.node_count());
  const std::uint64_t definitions = registry.name_count() + registry.node_count();
  EXPECT_EQ(file.record_count, definitions + file.ranges.size());
}

TEST_F(TraceRecordsTest, BackwardMarkersAreFlaggedInTheirPathRecord) {
  Registry& registry = Registry::instance();
  define_in_trace([](std::string_view name) { return name.size() > 9 && name.substr(name.size() - 9) == ".backward"; });
  push(registry.intern_name("trace_records_test.mlp"));
  const PathId forward = current();
  pop();
  push(registry.intern_name("trace_records_test.mlp.backward"));
  const PathId backward = current();
  pop();

  const trace::TraceFile file = read_back();
  ASSERT_NE(file.path(forward), nullptr);
  ASSERT_NE(file.path(backward), nullptr);
  EXPECT_FALSE(file.path(forward)->backward);
  EXPECT_TRUE(file.path(backward)->backward);
  EXPECT_EQ(file.path_nodes.at(backward).flags, trace::kPathBackward);
}

}  // namespace
}  // namespace actpage::ranges
