// Test helper: a trace file the engine's records go to while it lives.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include "trace/reader.hpp"
#include "trace/writer.hpp"

namespace actpage::engine::testing {

// A trace file in a temporary folder, the process's active writer while it lives: the engine's
// records go there. read() stops the writing and reads the file; the folder goes with the object.
class ActiveTraceFile {
 public:
  explicit ActiveTraceFile(const std::string& name)
      : dir_(std::filesystem::path(::testing::TempDir()) / ("actpage-engine-" + name + "-" + std::to_string(::getpid()))) {
    std::filesystem::create_directories(dir_);
    config_.path = (dir_ / (name + ".trace")).string();
    auto opened = trace::Writer::open(config_);
    EXPECT_TRUE(opened.ok()) << opened.status().message();
    if (opened.ok()) {
      writer_ = std::move(opened).value();
      trace::set_active(writer_.get());
    }
  }
  ~ActiveTraceFile() {
    stop();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  Result<trace::TraceFile> read() {
    stop();
    return trace::read_trace_file(config_.path);
  }

 private:
  void stop() {
    if (writer_ == nullptr) return;
    trace::set_active(nullptr);
    writer_->close();
    writer_.reset();
  }

  std::filesystem::path dir_;
  trace::WriterConfig config_;
  std::unique_ptr<trace::Writer> writer_;
};

}  // namespace actpage::engine::testing
