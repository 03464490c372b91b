#include "sink/sink_spec.h"

#include <algorithm>
#include <iterator>

#include "shard/state.h"
#include "util/json.h"
#include "util/try.h"

namespace tidemark {

std::string SinkSpec::to_json() const {
  std::string out = "{\"name\":";
  append_json_string(&out, name);
  out += ",\"shard\":";
  append_json_string(&out, shard);
  out += ",\"to\":";
  append_json_string(&out, to);
  out += envelope == Envelope::kUpsert ? ",\"envelope\":\"upsert\"" : ",\"envelope\":\"debezium\"";
  out += format == SinkFormat::kJson ? ",\"format\":\"json\"" : ",\"format\":\"csv\"";
  if (!owner.empty()) {
    out += ",\"owner\":";
    append_json_string(&out, owner);
  }
  if (!host.empty()) {
    out += ",\"host\":";
    append_json_string(&out, host);
  }
  return out + "}";
}

Result<SinkSpec> SinkSpec::parse(std::string_view json) {
  auto value = parse_json(json);
  if (!value || !value->is_object()) {
    return invalid_usage("expected {\"name\", \"shard\", \"to\", \"envelope\", \"format\"}");
  }
  // Every field is known and a string: a misspelt or unsupported one (an
  // "as_of", say) is an error, never silently dropped.
  static constexpr std::string_view kFields[] = {"name",   "shard", "to",  "envelope",
                                                 "format", "owner", "host"};
  for (const auto& [field, v] : value->as_object()) {
    if (std::find(std::begin(kFields), std::end(kFields), field) == std::end(kFields)) {
      return invalid_usage("unknown field \"" + field +
                           "\" (a sink takes name, shard, to, envelope and format)");
    }
    if (!v.is_string()) return invalid_usage("field \"" + field + "\" must be a string");
  }
  auto text = [&](const char* field) -> std::optional<std::string> {
    const JsonValue* v = value->find(field);
    if (v == nullptr) return std::nullopt;
    return v->as_string();
  };
  SinkSpec spec;
  auto name = text("name"), shard = text("shard"), to = text("to");
  if (!name || !shard || !to) return invalid_usage("a sink needs \"name\", \"shard\" and \"to\"");
  spec.name = *name;
  spec.shard = *shard;
  spec.to = *to;
  if (auto valid = validate_shard_name(spec.name); !valid) {
    return invalid_usage("sink name: " + valid.error().message);
  }
  TM_TRY(validate_shard_name(spec.shard));
  if (auto envelope = text("envelope")) {
    TM_ASSIGN(spec.envelope, parse_envelope(*envelope));
  }
  if (auto format = text("format")) {
    TM_ASSIGN(spec.format, parse_sink_format(*format));
  }
  if (auto owner = text("owner")) spec.owner = *owner;
  if (auto host = text("host")) spec.host = *host;
  TM_ASSIGN(SinkUrl url, parse_sink_url(spec.to, spec.format));
  (void)url;
  return spec;
}

}  // namespace tidemark
