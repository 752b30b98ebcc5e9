// qhx tokenize and qhx template: what the model's tokenizer and chat template make of stdin, to
// compare with transformers' output.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "backend/devices.h"
#include "chat/chat_template.h"
#include "commands.h"
#include "kernels/cpu_context.h"
#include "kernels/thread_pool.h"
#include "tokenizer/tokenizer.h"

namespace qhx::cli {

namespace fs = std::filesystem;

int run_tokenize(const std::string& model_dir) {
  const qhx::Tokenizer tokenizer = qhx::Tokenizer::load(model_dir);
  const std::string text((std::istreambuf_iterator<char>(std::cin)),
                         std::istreambuf_iterator<char>());
  const std::vector<int32_t> ids = tokenizer.encode(text, "stdin");
  std::cout << "[";
  for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? "," : "") << ids[i];
  std::cout << "]\n";
  return 0;
}

// stdin holds {"messages": [...], "tools": [...], "chat_template_kwargs": {...}}; prints the
// template's text as it is. The flags win over the kwargs.
int run_template(const TemplateArgs& args) {
  const qhx::Tokenizer tokenizer = qhx::Tokenizer::load(args.model);
  const std::string origin = (fs::path(args.model) / "chat_template").string();
  const qhx::ChatTemplate chat = qhx::ChatTemplate::from_tokenizer(tokenizer, origin);
  const std::string input((std::istreambuf_iterator<char>(std::cin)),
                          std::istreambuf_iterator<char>());
  qhx::ChatTemplateInputs inputs = qhx::parse_chat_request(input, "stdin");
  if (args.no_generation_prompt) inputs.add_generation_prompt = false;
  if (args.enable_thinking) inputs.set_enable_thinking(*args.enable_thinking);
  const std::string text = chat.render(inputs);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

int run_devices() {
  std::printf("cpu       %s · %d threads\n", qhx::CpuKernels::from_environment().describe().c_str(),
              qhx::hardware_threads());
  for (const std::string& line : qhx::describe_devices()) std::printf("%s\n", line.c_str());
  return 0;
}

}  // namespace qhx::cli
