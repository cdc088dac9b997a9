// The ChatML prompt (model/chat_template.h) against Jinja2 renderings of the
// real templates (tests/fixtures/chat_templates.json, made by
// tools/ref/chat_template_fixture.py from SmolLM2's and both Qwen2.5-Coder
// GGUFs): the template text is read from each GGUF present, so the test
// skips the models whose files are absent. Also the extraction rules on
// hand-written templates.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "../support/assets.h"
#include "ratekv/common/error.h"
#include "ratekv/io/gguf.h"
#include "ratekv/model/chat_template.h"

using namespace ratekv;
namespace fs = std::filesystem;

TEST(ChatTemplate, MatchesJinjaRenderingOfTheRealTemplates) {
  std::ifstream in(std::string(RATEKV_SOURCE_DIR) + "/tests/fixtures/chat_templates.json");
  ASSERT_TRUE(in) << "missing tests/fixtures/chat_templates.json";
  const auto j = nlohmann::json::parse(in);
  int checked = 0;
  for (const auto& m : j.at("models")) {
    const std::string path = ratekv_test::assets_dir() + "/models/" + m.at("model").get<std::string>();
    if (!fs::exists(path)) continue;
    const GgufFile f = GgufFile::open(path);
    const std::string tpl = f.get_string("tokenizer.chat_template");
    ASSERT_TRUE(is_chatml_template(tpl)) << path;
    for (const auto& c : m.at("cases")) {
      EXPECT_EQ(chatml_prompt(tpl, c.at("user").get<std::string>()), c.at("rendered").get<std::string>())
          << m.at("model");
      ++checked;
    }
  }
  if (checked == 0) GTEST_SKIP() << "no model of chat_templates.json under " << ratekv_test::assets_dir();
  std::printf("chat templates: %d renderings equal\n", checked);
}

TEST(ChatTemplate, DefaultSystemExtraction) {
  // A constant system turn with a real newline (SmolLM2's form) ...
  EXPECT_EQ(chatml_default_system("{{ '<|im_start|>system\nBe brief.<|im_end|>\n' }}"), "Be brief.");
  // ... or the Jinja escape, after turns that splice variables (Qwen's form).
  EXPECT_EQ(chatml_default_system("{{- '<|im_start|>system\\n' }}{{ messages[0]['content'] }}"
                                  "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
                                  "{{- '<|im_start|>system\\nLine one\\nline two.<|im_end|>\\n' }}"),
            "Line one\nline two.");
  // No default system turn: nothing is added.
  const std::string bare = "{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>'}}"
                           "{% endfor %}";
  EXPECT_EQ(chatml_default_system(bare), "");
  EXPECT_EQ(chatml_prompt(bare, "hi"), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  // Not ChatML: an error, not a silently wrong prompt.
  EXPECT_THROW(chatml_default_system("<start_of_turn>user\n{{ m }}<end_of_turn>"), Error);
  EXPECT_THROW(chatml_prompt("", "hi"), Error);
}
