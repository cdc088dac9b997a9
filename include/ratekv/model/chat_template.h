// ratekv/model/chat_template.h — the ChatML prompt of a model's
// tokenizer.chat_template (SmolLM2, Qwen2.5), without a Jinja engine.
//
// ChatML wraps each turn as "<|im_start|>ROLE\nCONTENT<|im_end|>\n" and asks
// for a reply with "<|im_start|>assistant\n". The templates these models ship
// insert a default system turn when the conversation has none (SmolLM2: "You
// are a helpful AI assistant named SmolLM, ..."; Qwen2.5: "You are Qwen,
// created by Alibaba Cloud. ..."); that default is the one thing read from
// the template text. Checked against Jinja2 renderings of the real templates
// (tests/fixtures/chat_templates.json, tools/ref/chat_template_fixture.py).
#pragma once

#include <string>
#include <string_view>

namespace ratekv {

/// True when `tpl` (tokenizer.chat_template) is a ChatML template: it
/// contains "<|im_start|>".
bool is_chatml_template(std::string_view tpl);

/// The default system message of a ChatML template: the literal content of
/// the first "<|im_start|>system" turn written out as constant text in the
/// template — after "system", a newline (a real one or the Jinja escape
/// "\n"), then text with no template syntax ({ } ' " + <) up to
/// "<|im_end|>" — with Jinja string escapes (\n, \t, \', \", \\) resolved.
/// "" when the template has none. Throws Error when `tpl` is not ChatML.
std::string chatml_default_system(std::string_view tpl);

/// One user turn and the generation prompt, as the model's ChatML template
/// renders messages = [{user}] with add_generation_prompt:
///   [<|im_start|>system\n{default}<|im_end|>\n]<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n
/// (the system turn only when chatml_default_system is not empty). Throws
/// Error when `tpl` is not ChatML.
std::string chatml_prompt(std::string_view tpl, std::string_view user);

}  // namespace ratekv
