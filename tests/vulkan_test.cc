// The Vulkan backend in a run: the device check before use (a pass is cached, a perturbed shader
// is refused and the CPU takes over), a device failure mid-reply that the CPU finishes with the
// same tokens, and chat turns with prompts on the device. On the tests' device
// (support/vulkan_device.h: lavapipe in CI).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "forge/convert.h"
#include "models/decoder_state.h"
#include "models/model.h"
#include "qhx/qhx.h"
#include "runtime/device_check.h"
#include "runtime/gate.h"
#include "runtime/session.h"
#include "support/cli_run.h"
#include "support/expect_error.h"
#include "support/fixtures.h"
#include "support/raw_safetensors.h"
#include "support/vulkan_device.h"
#include "tokenizer/tokenizer.h"
#include "util/json_file.h"

namespace qhx {
namespace {

namespace fs = std::filesystem;

const char* const kFixtures[] = {"qwen3/gqa2_f16", "qwen3_5/gva2_tied"};

fs::path fixture(const char* name) {
  return test::source_dir() / "tests/fixtures" / name;
}

std::unique_ptr<Model> on_device(const fs::path& dir, std::shared_ptr<VulkanDevice> device,
                                 const VulkanBackendOptions& options) {
  return load_model(dir,
                    {.devices = {std::make_shared<VulkanBackend>(std::move(device), options)}});
}

// Greedy replies to `turns` prompts in one session (each turn continues the last).
std::vector<std::vector<int32_t>> chat(const Model& model, int turns, int64_t tokens,
                                       const SessionOptions& options = {},
                                       DraftKind drafts = DraftKind::kNone) {
  Session session(model, options);
  std::vector<std::vector<int32_t>> replies;
  std::vector<int32_t> history;
  for (int turn = 0; turn < turns; ++turn) {
    for (int32_t i = 0; i < 6; ++i) history.push_back((turn * 37 + i * 11 + 5) % 300);
    TurnOptions t;
    t.max_new_tokens = tokens;
    t.speculative.kind = drafts;
    std::vector<int32_t>& reply = replies.emplace_back();
    session.generate(history, t, [&](int32_t id) {
      reply.push_back(id);
      return true;
    });
    history.insert(history.end(), reply.begin(), reply.end());
  }
  return replies;
}

TEST(DeviceCheck, PassesAnHonestDeviceOnceAndRemembersIt) {
  QHX_VULKAN_DEVICE_OR_SKIP(device);
  const test::TempDir cache;
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    DeviceCheckOptions options;
    options.cache_dir = cache.path();
    const auto model = on_device(fixture(name), device, {});
    const DeviceCheckResult first = check_devices(*model, "test device", nullptr, options);
    EXPECT_TRUE(first.passed) << first.summary;
    EXPECT_TRUE(first.checked);
    EXPECT_TRUE(model->devices_enabled());
    const DeviceCheckResult second = check_devices(*model, "test device", nullptr, options);
    EXPECT_TRUE(second.passed && second.cached && !second.checked) << second.summary;
    options.mode = DeviceCheckMode::kAlways;
    EXPECT_TRUE(check_devices(*model, "test device", nullptr, options).checked);
  }
}

// A shader that returns wrong numbers (the test switch perturbs one op kind's output) is refused:
// the devices are off and the model gives the CPU's tokens; nothing is cached.
TEST(DeviceCheck, RefusesAPerturbedShaderAndLeavesTheCpu) {
  QHX_VULKAN_DEVICE_OR_SKIP(device);
  const test::TempDir cache;
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    for (const char* op : {"silu_mul", "rms_norm", "matmul"}) {
      SCOPED_TRACE(op);
      VulkanBackendOptions perturbed;
      perturbed.perturb_op = op;
      const auto model = on_device(fixture(name), device, perturbed);
      DeviceCheckOptions options;
      options.cache_dir = cache.path();
      const DeviceCheckResult r = check_devices(*model, "perturbed device", nullptr, options);
      EXPECT_FALSE(r.passed);
      EXPECT_NE(r.summary.find("disagrees with the CPU"), std::string::npos) << r.summary;
      EXPECT_FALSE(model->devices_enabled());
      const auto cpu = load_model(fixture(name));
      EXPECT_EQ(chat(*model, 1, 8), chat(*cpu, 1, 8));
    }
  }
  EXPECT_FALSE(fs::exists(cache.path() / "device-checks") &&
               !fs::is_empty(cache.path() / "device-checks"));
}

// A device that fails at any submission of a reply (the fault-injection switch) costs the reply
// nothing: the CPU redoes that pass from the state it started from and goes on, with the tokens
// of an uninterrupted run.
TEST(DeviceFallback, AFailureMidReplyIsFinishedByTheCpuWithTheSameTokens) {
  QHX_VULKAN_DEVICE_OR_SKIP(device);
  SessionOptions chunked;
  chunked.prefill_chunk = 4;  // several prompt passes per turn
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    // Decoding on the device with states in the memory the CPU reads, with private device-local
    // copies of them (a discrete GPU's), and decoding on the CPU.
    for (const auto& [decode, private_states] :
         {std::pair(true, false), std::pair(true, true), std::pair(false, false)}) {
      VulkanBackendOptions options;
      options.decode = decode;
      options.private_states = private_states;
      const auto backend = std::make_shared<VulkanBackend>(device, options);
      const auto reference =
          chat(*load_model(fixture(name), {.devices = {backend}}), 2, 6, chunked);
      // The first, second, middle and last submission of the uninterrupted reply; every one
      // with private states, whose kept passes are redone from their start (a failure of a
      // decode step several steps after the last write-back, or of a write-back itself).
      const int64_t total = backend->submissions();
      ASSERT_GE(total, 3);
      std::vector<int64_t> failing = {1, 2, (total + 1) / 2, total};
      if (private_states) {
        failing.clear();
        for (int64_t n = 1; n <= total; ++n) failing.push_back(n);
      }
      for (const int64_t n : failing) {
        SCOPED_TRACE("decode on device " + std::to_string(decode) + ", private states " +
                     std::to_string(private_states) + ", failing submission " + std::to_string(n));
        options.fail_submission = n;
        const auto model = on_device(fixture(name), device, options);
        EXPECT_EQ(chat(*model, 2, 6, chunked), reference);
        EXPECT_EQ(model->device_failures(), 1);
        EXPECT_FALSE(model->devices_enabled());
        EXPECT_NE(model->device_failure().find("fault injected"), std::string::npos);
      }
    }
  }
}

// Device memory running out is the device's failure too: as the model loads (no room for its
// weights: it runs on the CPU and says so) or mid-reply (the arena, scratch, a state's private
// copy: the CPU finishes the reply). Every allocation of an uninterrupted chat fails in turn; the
// replies stay the same.
TEST(DeviceFallback, RunningOutOfDeviceMemoryLeavesTheRepliesTheSame) {
  QHX_VULKAN_DEVICE_OR_SKIP(device);
  SessionOptions chunked;
  chunked.prefill_chunk = 4;
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    for (const bool private_states : {false, true}) {
      VulkanBackendOptions options;
      options.decode = true;
      options.private_states = private_states;
      options.weights_in_place = false;  // uploaded, as a discrete GPU's are
      auto backend = std::make_shared<VulkanBackend>(device, options);
      auto model = load_model(fixture(name), {.devices = {backend}});
      const int64_t at_load = backend->device_allocations();
      const auto reference = chat(*model, 2, 6, chunked);
      const int64_t total = backend->device_allocations();
      ASSERT_GT(at_load, 0);
      ASSERT_GT(total, at_load);
      model.reset();
      for (int64_t n = 1; n <= total; ++n) {
        SCOPED_TRACE("private states " + std::to_string(private_states) + ", failing allocation " +
                     std::to_string(n) + " of " + std::to_string(total) + " (" +
                     std::to_string(at_load) + " at load)");
        options.fail_allocation = n;
        const auto failing_backend = std::make_shared<VulkanBackend>(device, options);
        const auto failing = load_model(fixture(name), {.devices = {failing_backend}});
        if (n <= at_load) {
          // Nothing runs on the device, not even when asked to, and the device check says why.
          failing->set_devices_enabled(true);
          EXPECT_FALSE(failing->devices_enabled());
          EXPECT_EQ(failing_backend->weight_memory().copied_bytes, 0);
          const DeviceCheckResult check = check_devices(*failing, "vulkan:0", nullptr, {});
          EXPECT_FALSE(check.passed);
          EXPECT_NE(check.summary.find("failed as the model loaded"), std::string::npos)
              << check.summary;
        }
        EXPECT_EQ(chat(*failing, 2, 6, chunked), reference);
        EXPECT_GE(failing_backend->device_allocations(), n) << "the failing one was not reached";
        // A private copy of a KV cache without room is computed in the cache's own memory
        // instead: not every allocation that fails is a failure of the device.
        EXPECT_LE(failing->device_failures(), 1);
        if (failing->device_failures() == 1) {
          EXPECT_NE(failing->device_failure().find("out of device memory"), std::string::npos)
              << failing->device_failure();
        } else {
          EXPECT_TRUE(private_states && n > at_load) << "an allocation failed unnoticed";
        }
      }
    }
  }
}

// Decoding on the device with private device-local copies of the states (as on a discrete GPU)
// computes what it computes in the states' own memory, to the bit, and keeps that memory equal to
// the copies: the states the CPU would read after each pass are the same, and a state read by the
// host (which drops the copies) goes on from there. Prompt chunks, decode steps, a rewind, CPU
// steps between device ones, a restored snapshot, a reset, and chats.
TEST(DeviceStates, PrivateCopiesComputeWhatTheStatesOwnMemoryComputes) {
  QHX_VULKAN_DEVICE_OR_SKIP(device);
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    VulkanBackendOptions shared_states, private_states;
    shared_states.decode = private_states.decode = true;
    private_states.private_states = true;
    const auto a = on_device(fixture(name), device, shared_states);
    const auto b = on_device(fixture(name), device, private_states);
    auto sa = a->new_state(), sb = b->new_state();
    const auto same_states = [&](const std::string& when) {
      const std::vector<StateTensor> ta = sa->tensors(), tb = sb->tensors();
      ASSERT_EQ(ta.size(), tb.size());
      for (size_t i = 0; i < ta.size(); ++i) {
        EXPECT_TRUE(
            std::equal(ta[i].data.begin(), ta[i].data.end(), tb[i].data.begin(), tb[i].data.end()))
            << ta[i].name << " " << when;
      }
    };
    std::vector<float> la, lb;
    const auto step = [&](std::vector<int32_t> ids, const std::string& when) {
      a->forward(ids, *sa, LogitsFor::kLastToken, la);
      b->forward(ids, *sb, LogitsFor::kLastToken, lb);
      EXPECT_EQ(la, lb) << when;
    };
    step({1, 5, 9, 13, 17, 21}, "prompt chunk 1");
    step({25, 29, 33}, "prompt chunk 2");
    for (int32_t t = 0; t < 3; ++t) step({static_cast<int32_t>(40 + t)}, "decode step");
    // The conv and recurrent states stayed on the device (nothing written back per step) ...
    const auto& db = dynamic_cast<const DecoderState&>(*sb);
    EXPECT_EQ(db.whole_states().empty(), std::string(name).starts_with("qwen3/"));  // Qwen3.5's
    for (const StateBuffer* whole : db.whole_states()) EXPECT_TRUE(whole->behind_shadow());
    // ... until the host reads them: written back, to the bit of the shared states.
    same_states("after decoding");
    for (const StateBuffer* whole : db.whole_states()) EXPECT_FALSE(whole->behind_shadow());
    const StateCheckpoint at = sa->checkpoint();
    step({7, 8}, "after the host read them");
    sa->rewind(at.n_past, &at);
    sb->rewind(at.n_past, &at);
    step({9}, "after a rewind");
    // The CPU writing the states (a step with the devices off), then the device again.
    for (Model* m : {a.get(), b.get()}) m->set_devices_enabled(false);
    step({11}, "on the CPU");
    for (Model* m : {a.get(), b.get()}) m->set_devices_enabled(true);
    step({12}, "after the CPU wrote the states");
    // A snapshot restored, and a state reset.
    const auto snapshot_a = sa->clone(), snapshot_b = sb->clone();
    step({13, 14}, "before a restore");
    sa->restore(*snapshot_a);
    sb->restore(*snapshot_b);
    step({15}, "after a restore");
    sa->reset();
    sb->reset();
    step({1, 2, 3}, "after a reset");
    same_states("at the end");
    // Sessions: chunked prompts, turns that continue the last, drafts verified and rewound.
    SessionOptions chunked;
    chunked.prefill_chunk = 4;
    for (const DraftKind drafts : {DraftKind::kNone, DraftKind::kNgram}) {
      EXPECT_EQ(chat(*a, 3, 6, chunked, drafts), chat(*b, 3, 6, chunked, drafts));
    }
  }
}

// Through the C API, as the server uses it: the fault-injection switch from the environment, a
// reply that is the CPU's, the failure counted in the result (the server's timings) and the model
// on the CPU afterwards.
TEST(DeviceFallback, TheCApiReportsTheFailureAndNothingElseChanges) {
  QHX_VULKAN_DEVICE_OR_SKIP(device);
  const std::string dir = fixture(kFixtures[1]).string();
  const auto reply = [&](const char* device_name, qhx_generate_result* result) {
    qhx_model_options mo;
    qhx_model_options_default(&mo);
    mo.device = device_name;
    mo.decode_device = device_name;
    mo.device_check = "never";
    qhx_model* model = nullptr;
    EXPECT_EQ(qhx_model_open(dir.c_str(), &mo, &model), QHX_OK) << qhx_last_error();
    qhx_session* session = nullptr;
    EXPECT_EQ(qhx_session_create(model, nullptr, &session), QHX_OK);
    qhx_generate_options options;
    qhx_generate_options_default(model, &options);
    options.max_new_tokens = 12;
    options.sampling.greedy = 1;
    std::vector<int32_t> ids;
    const int32_t prompt[] = {5, 17, 101, 33, 250, 7, 64};
    EXPECT_EQ(qhx_session_generate(
                  session, prompt, std::size(prompt), &options,
                  [](void* user, int32_t id, const char*, size_t) {
                    if (id >= 0) static_cast<std::vector<int32_t>*>(user)->push_back(id);
                    return 0;
                  },
                  &ids, result),
              QHX_OK)
        << qhx_last_error();
    qhx_string_free(result->text);
    qhx_model_info info;
    qhx_model_get_info(model, &info);
    const std::string where = info.decode_device;
    qhx_session_destroy(session);
    qhx_model_close(model);
    return std::pair{ids, where};
  };
  qhx_generate_result on_cpu{}, failed{};
  const auto cpu = reply("cpu", &on_cpu);
  ::setenv("QHX_VULKAN_FAIL_SUBMISSION", "4", 1);
  const auto device_run = reply("vulkan", &failed);
  ::unsetenv("QHX_VULKAN_FAIL_SUBMISSION");
  EXPECT_EQ(device_run.first, cpu.first);
  EXPECT_EQ(failed.device_failures, 1);
  EXPECT_EQ(on_cpu.device_failures, 0);
  EXPECT_EQ(device_run.second, "cpu");
}

// A checkpoint whose MTP head is cut short runs on the device as the text model it is.
TEST(DeviceCli, AnIncompleteMtpHeadRunsAsATextModel) {
  QHX_VULKAN_DEVICE_OR_SKIP(device);
  const test::TempDir dir;
  ::setenv("QHX_CACHE_DIR", (dir.path() / "cache").c_str(), 1);
  const fs::path whole = fixture("qwen3_5/multimodal_layout"), partial = dir.path() / "partial";
  test::copy_checkpoint(whole, partial, [](const std::string& name) {
    return name.starts_with("mtp.") && name != "mtp.fc.weight" && name != "mtp.norm.weight";
  });
  const std::string args = " --prompt-ids 1,2,3,4 -n 9 --greedy --print-ids";
  const test::CliRun cpu = test::run_qhx("generate --model " + whole.string() + args);
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  const test::CliRun r =
      test::run_qhx("generate --model " + partial.string() + args + " --device vulkan");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, cpu.out);
  EXPECT_NE(r.err.find("agrees with the CPU"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("missing 13 of 15 tensors"), std::string::npos) << r.err;
}

// The command line's contract: with --device vulkan (and any --decode-device), --print-ids prints
// exactly one line: the CPU's ids. A device that fails its check says so on stderr and the ids
// are still the CPU's.
TEST(DeviceCli, PrintIdsGivesTheCpusLineOfIds) {
  QHX_VULKAN_DEVICE_OR_SKIP(device);
  const test::TempDir cache;
  ::setenv("QHX_CACHE_DIR", cache.path().c_str(), 1);
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    const std::string run = "generate --model " + fixture(name).string() +
                            " --prompt-ids 1,2,3 -n 9 --greedy --print-ids";
    const test::CliRun cpu = test::run_qhx(run);
    ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
    ASSERT_EQ(std::count(cpu.out.begin(), cpu.out.end(), '\n'), 1) << cpu.out;
    for (const char* decode : {"", " --decode-device cpu", " --decode-device vulkan"}) {
      const test::CliRun r = test::run_qhx(run + " --device vulkan" + decode);
      ASSERT_EQ(r.exit_code, 0) << r.err;
      EXPECT_EQ(r.out, cpu.out) << decode;
      // Checked by the first run, remembered by the others.
      EXPECT_NE(r.err.find(*decode == '\0' ? "agrees with the CPU" : "passed its check before"),
                std::string::npos)
          << r.err;
    }
    ::setenv("QHX_VULKAN_PERTURB", "silu_mul", 1);
    const test::CliRun refused = test::run_qhx(run + " --device vulkan --device-check always");
    ::unsetenv("QHX_VULKAN_PERTURB");
    EXPECT_EQ(refused.out, cpu.out);
    EXPECT_NE(refused.err.find("disagrees with the CPU"), std::string::npos) << refused.err;
  }
  ::unsetenv("QHX_CACHE_DIR");
}

// qhx bench --profile: per device, its peaks and where its time went in a prompt pass and in a
// decode step, as a table and in --json; it asks for a device that times its work and for the
// runs it profiles.
TEST(DeviceCli, BenchProfileSaysWhereTheDevicesTimeWent) {
  QHX_VULKAN_DEVICE_OR_SKIP(device);
  const test::TempDir cache;
  const test::ScopedEnv cache_dir("QHX_CACHE_DIR", cache.path().string());
  const std::string bench = "bench " + fixture("qwen3_5/gva2_tied").string() +
                            " -p 16 -n 4 -r 2 --device vulkan --decode-device vulkan --profile";
  const test::CliRun table = test::run_qhx(bench);
  ASSERT_EQ(table.exit_code, 0) << table.err;
  for (const char* part :
       {"peaks measured: read ", "fp32 FMA", "profile of a prompt pass of 16 tokens",
        "profile of a decode step (4 steps after depth 0)", "delta_rule", "matmul", "of peak"}) {
    EXPECT_NE(table.out.find(part), std::string::npos) << part << " in\n" << table.out;
  }
  const test::CliRun json = test::run_qhx(bench + " --json");
  ASSERT_EQ(json.exit_code, 0) << json.err;
  const Json record = Json::parse(json.out);  // one configuration: one line
  ASSERT_EQ(record["profile"].size(), 1u) << json.out;
  const Json& p = record["profile"][0];
  EXPECT_GT(p["peaks"]["read_gb_s"].get<double>(), 0.0);
  for (const char* phase : {"prefill", "decode"}) {
    const Json& profile = p[phase];
    ASSERT_FALSE(profile["ops"].empty()) << phase;
    double ms = 0;
    for (const Json& op : profile["ops"]) {
      EXPECT_GT(op["ms"].get<double>(), 0.0) << op.dump();
      EXPECT_GT(op["mb"].get<double>(), 0.0) << op.dump();
      if (std::string(phase) == "decode") {
        EXPECT_EQ(op["rows"].get<int64_t>(), 1) << op.dump();
      }
      ms += op["ms"].get<double>();
    }
    EXPECT_NEAR(ms, profile["device_ms"].get<double>(), 1e-6 * ms) << phase;
    EXPECT_EQ(profile["passes"].get<int64_t>(), std::string(phase) == "decode" ? 8 : 2);
  }
  const test::CliRun cpu = test::run_qhx("bench " + fixture("qwen3_5/gva2_tied").string() +
                                         " -p 16 -n 4 -r 1 --profile");
  EXPECT_NE(cpu.exit_code, 0);
  EXPECT_NE(cpu.err.find("--profile: no device here times its work"), std::string::npos) << cpu.err;
  const test::CliRun turns = test::run_qhx(bench + " --turns 2");
  EXPECT_NE(turns.exit_code, 0);
  EXPECT_NE(turns.err.find("--profile: profiles the prefill and decode runs only"),
            std::string::npos)
      << turns.err;
}

// A device that fails its check leaves the runs to the CPU, and qhx bench says so: its records
// and its header name the CPU, the decode is held against the CPU's memory, --profile refuses.
TEST(DeviceCli, BenchOfADeviceThatFailsItsCheckSaysTheCpuRanIt) {
  QHX_VULKAN_DEVICE_OR_SKIP(device);
  const test::TempDir cache;
  const test::ScopedEnv cache_dir("QHX_CACHE_DIR", cache.path().string());
  const std::string bench = "bench " + fixture("qwen3/gqa2_f16").string() +
                            " -p 16 -n 2 -r 1 --device vulkan --decode-device vulkan";
  {
    const test::ScopedEnv perturbed("QHX_VULKAN_PERTURB", "matmul");
    const test::CliRun json = test::run_qhx(bench + " --json");
    ASSERT_EQ(json.exit_code, 0) << json.err;
    EXPECT_NE(json.err.find("disagrees with the CPU"), std::string::npos) << json.err;
    const Json record = Json::parse(json.out);
    EXPECT_EQ(record["prefill_device"], "cpu") << json.out;
    EXPECT_EQ(record["decode_device"], "cpu") << json.out;
    EXPECT_EQ(record["memory_read_by"], "cpu") << json.out;
    const test::CliRun table = test::run_qhx(bench);
    EXPECT_NE(table.out.find("prompts on cpu, replies on cpu"), std::string::npos) << table.out;
    const test::CliRun profile = test::run_qhx(bench + " --profile");
    EXPECT_NE(profile.exit_code, 0);
    EXPECT_NE(profile.err.find("--profile: the device failed its check before use"),
              std::string::npos)
        << profile.err;
  }
  // Unperturbed, the same runs are the device's, and a decode on it is held against no CPU
  // figure without its peaks (--profile measures them).
  const test::CliRun honest = test::run_qhx(bench + " --json");
  ASSERT_EQ(honest.exit_code, 0) << honest.err;
  const Json on_device = Json::parse(honest.out);
  EXPECT_EQ(on_device["prefill_device"], "vulkan:0") << honest.out;
  EXPECT_EQ(on_device["decode_device"], "vulkan:0") << honest.out;
  EXPECT_TRUE(on_device["decode_bandwidth_fraction"].is_null()) << honest.out;
}

// Compiled pipelines are kept on disk for the next process (a driver stores binaries there;
// lavapipe only a header), and a cache file of another device or a damaged one is no error.
TEST(DevicePipelines, AreCachedOnDiskAndADamagedCacheIsIgnored) {
  QHX_VULKAN_DEVICE_OR_SKIP(device);
  const test::TempDir cache;
  const auto run_once = [&] {
    const auto opened = VulkanDevice::open(0, cache.path());
    const auto model = on_device(fixture(kFixtures[0]), opened, {});
    return chat(*model, 1, 4);
  };
  const auto first = run_once();
  const fs::path dir = cache.path() / "vulkan-pipelines";
  ASSERT_TRUE(fs::exists(dir));
  ASSERT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
  const fs::path file = fs::directory_iterator(dir)->path();
  EXPECT_GT(fs::file_size(file), 0u);
  EXPECT_EQ(run_once(), first);
  std::ofstream(file, std::ios::binary | std::ios::trunc) << "not a pipeline cache";
  EXPECT_EQ(run_once(), first);
}

// Five chat turns with prompts on the device and replies on the CPU: the CPU's tokens.
TEST(DeviceChat, FiveTurnsGiveTheCpusReplies) {
  QHX_VULKAN_DEVICE_OR_SKIP(device);
  for (const char* name : {"qwen3/kjv_trained", "qwen3_5/kjv_trained"}) {
    SCOPED_TRACE(name);
    const fs::path dir = test::source_dir() / "models" /
                         (std::string(name).starts_with("qwen3_5") ? "qwen3.5-kjv" : "qwen3-kjv");
    const auto cpu = load_model(dir);
    const auto model = on_device(dir, device, {});
    const auto replies = chat(*cpu, 5, 8);
    const int64_t start = model->device_traffic().passes;
    EXPECT_EQ(chat(*model, 5, 8), replies);
    const int64_t prompt_passes = model->device_traffic().passes - start;
    EXPECT_GT(prompt_passes, 0);
    // Speculation's verify passes run where decoding does (the CPU), not where prompts do: the
    // device runs the same prompt passes and nothing more.
    EXPECT_EQ(chat(*model, 5, 8, {}, DraftKind::kNgram), replies);
    EXPECT_EQ(model->device_traffic().passes - start, 2 * prompt_passes);
    // The MTP head reads the final-norm rows of the device's prompt passes (copied back as the
    // logits are) and of the CPU's steps.
    if (model->has_mtp()) {
      EXPECT_EQ(chat(*model, 5, 8, {}, DraftKind::kMtp), replies);
      EXPECT_EQ(model->device_traffic().passes - start, 3 * prompt_passes);
    }
  }
}

// W8 and W4 bundles (int8 activations where their gate took them) with everything on the device
// pass the gate against their Hugging Face checkpoint, with the numbers they have on the CPU: W8
// of two fixtures, W4 of the trained Qwen3.5 (W4 is too coarse for the tiny random ones even on
// the CPU).
TEST(DeviceGate, QuantizedBundlesPassTheirGateOnTheDevice) {
  QHX_VULKAN_DEVICE_OR_SKIP(device);
  const test::TempDir out;
  struct Case {
    fs::path source;
    DType weights;
    int64_t prompts, greedy_tokens;  // the fixtures: the gate's default suite
  };
  const Case cases[] = {{fixture(kFixtures[0]), DType::kW8, 8, 32},
                        {fixture(kFixtures[1]), DType::kW8, 8, 32},
                        {test::source_dir() / "models/qwen3.5-kjv", DType::kW4, 4, 16}};
  for (const Case& c : cases) {
    const fs::path& source = c.source;
    const DType d = c.weights;
    SCOPED_TRACE(source.string() + " " + std::string(dtype_name(d)));
    ConvertOptions o;
    o.weights = d;
    o.gate_suite.prompts = c.prompts;
    o.gate_suite.greedy_tokens = c.greedy_tokens;
    const fs::path bundle =
        out.path() / (std::string(dtype_name(d)) + "-" + source.filename().string());
    const ConvertResult converted = forge_convert(source, bundle, o);
    ASSERT_TRUE(converted.gate.has_value());
    ASSERT_TRUE(converted.published) << converted.gate->summary();
    VulkanBackendOptions everything;
    everything.decode = true;
    const auto model = on_device(bundle, device, everything);
    const auto reference = load_model(source);
    const std::optional<Tokenizer> tokenizer = fs::exists(source / "tokenizer.json")
                                                   ? std::optional(Tokenizer::load(source))
                                                   : std::nullopt;
    const GateReport report =
        run_gate(*model, *reference,
                 gate_prompt_suite(tokenizer ? &*tokenizer : nullptr,
                                   reference->config().vocab_size, o.gate_suite.prompts),
                 o.gate_suite.greedy_tokens, default_gate_thresholds(d));
    EXPECT_TRUE(report.passed) << report.summary() << " (on the CPU: " << converted.gate->summary()
                               << ", int8 activations " << converted.int8_activations << ")";
    std::printf("%s %s on %s: %s (on the CPU: %s)\n", source.filename().c_str(),
                std::string(dtype_name(d)).c_str(), device->info().name.c_str(),
                report.summary().c_str(), converted.gate->summary().c_str());
  }
}

// Where the device shares the host's memory and imports it (lavapipe does), a mapped file's
// matrices are read in place, with no copy: the same logits to the bit as from uploaded copies
// (the same bytes through the same shaders), for safetensors checkpoints (f16, bf16: tensors at
// any offset the file gives them) and W8/W4 bundles (data and scales).
TEST(DeviceWeights, MappedWeightsAreReadInPlaceWithTheResultsOfCopies) {
  QHX_VULKAN_DEVICE_OR_SKIP(device);
  const VulkanDeviceInfo& info = device->info();
  if (info.discrete || info.host_import_alignment == 0) {
    GTEST_SKIP() << info.name << " keeps its weights in memory of its own";
  }
  const test::TempDir out;
  std::vector<fs::path> models = {fixture(kFixtures[0]), fixture(kFixtures[1])};
  for (const DType d : {DType::kW8, DType::kW4}) {
    ConvertOptions o;
    o.weights = d;
    o.gate = false;
    o.int8_activations = d == DType::kW8;  // both matmul forms
    models.push_back(out.path() / dtype_name(d));
    forge_convert(fixture(kFixtures[1]), models.back(), o);
  }
  for (const fs::path& dir : models) {
    SCOPED_TRACE(dir.string());
    VulkanBackendOptions in_place, copied;
    in_place.decode = copied.decode = true;
    copied.weights_in_place = false;
    auto in_place_backend = std::make_shared<VulkanBackend>(device, in_place);
    auto copied_backend = std::make_shared<VulkanBackend>(device, copied);
    const auto a = load_model(dir, {.devices = {in_place_backend}});
    const auto b = load_model(dir, {.devices = {copied_backend}});
    const WeightMemory wa = in_place_backend->weight_memory();
    const WeightMemory wb = copied_backend->weight_memory();
    EXPECT_GT(wa.in_place_bytes, wa.copied_bytes);
    EXPECT_EQ(wb.in_place_bytes, 0);
    EXPECT_EQ(wa.in_place_bytes + wa.copied_bytes, wb.copied_bytes);
    const std::vector<int32_t> prompt = {1, 5, 9, 13, 17, 21, 25, 29, 33};
    auto sa = a->new_state(), sb = b->new_state();
    std::vector<float> la, lb;
    a->forward(prompt, *sa, LogitsFor::kEveryToken, la);
    b->forward(prompt, *sb, LogitsFor::kEveryToken, lb);
    EXPECT_EQ(la, lb) << "prefill";
    const int32_t next = 7;
    a->forward(std::span(&next, 1), *sa, LogitsFor::kLastToken, la);
    b->forward(std::span(&next, 1), *sb, LogitsFor::kLastToken, lb);
    EXPECT_EQ(la, lb) << "decode";
    std::printf("%s: %.2f MB in place, %.2f MB copied\n", dir.filename().c_str(),
                static_cast<double>(wa.in_place_bytes) / 1e6,
                static_cast<double>(wa.copied_bytes) / 1e6);
  }
}

// A device keeps a model's weights by their ids (number_weights), all of them uploaded as the
// model loads: the matrices, the norm, conv and gate vectors, and the embedding table when it
// decodes (one copy with the lm-head when they are tied). It holds one model's weights at a time
// (ids would collide), and nothing once the model closes.
TEST(DeviceWeights, AModelsWeightsGoUpAsItLoadsKeptByIdForOneModelAtATime) {
  QHX_VULKAN_DEVICE_OR_SKIP(device);
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    const auto copying = [&](bool decode) {
      VulkanBackendOptions o;
      o.decode = decode;
      o.weights_in_place = false;
      return std::make_shared<VulkanBackend>(device, o);
    };
    const auto prompts = copying(false), decodes = copying(true);
    auto model = load_model(fixture(name), {.devices = {prompts}});
    const auto decoding = load_model(fixture(name), {.devices = {decodes}});
    const ModelConfig& c = model->config();
    const bool tied = std::string(name).find("tied") != std::string::npos;
    const int64_t table_bytes = tied ? 0 : c.vocab_size * c.hidden_size * 2;  // f16 when untied
    EXPECT_EQ(decodes->weight_memory().copied_bytes - prompts->weight_memory().copied_bytes,
              table_bytes);
    test::expect_error([&] { load_model(fixture(name), {.devices = {prompts}}); },
                       {"vulkan", "holds another model's weights"});
    const std::vector<int32_t> prompt = {1, 5, 9, 13};
    auto state = model->new_state();
    std::vector<float> before, after;
    model->forward(prompt, *state, LogitsFor::kEveryToken, before);
    model.reset();
    EXPECT_EQ(prompts->weight_memory().copied_bytes, 0);
    model = load_model(fixture(name), {.devices = {prompts}});  // the device is free again
    state = model->new_state();
    model->forward(prompt, *state, LogitsFor::kEveryToken, after);
    EXPECT_EQ(after, before);
  }
}

}  // namespace
}  // namespace qhx
