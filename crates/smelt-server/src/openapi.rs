//! `GET /openapi.json`: a hand-written OpenAPI 3.1 description of every endpoint. Hand-written
//! because the request bodies are OpenAI's, whose shapes (string-or-list fields) a derive
//! would describe worse than a page of JSON; a test checks every route is in it.

pub(crate) const SPEC: &str = r##"{
  "openapi": "3.1.0",
  "info": {
    "title": "smelt",
    "version": "0.1.0",
    "description": "OpenAI-compatible inference server for GGUF models. When the server has an API key, /v1/* needs `Authorization: Bearer <key>`; /admin/* needs the admin key (--admin-key), and /metrics the metrics key when one is set. Request bodies must be `application/json` (415 otherwise); cross-origin browser requests are refused (403) unless --cors allows their origin, as are Host names the server does not answer to. Errors are {\"error\": {\"message\", \"type\", \"param\", \"code\"}}."
  },
  "components": {
    "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
    "schemas": {
      "Error": {
        "type": "object",
        "properties": {"error": {"type": "object", "properties": {
          "message": {"type": "string"}, "type": {"type": "string"},
          "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}
      },
      "Stop": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
      "Sampling": {
        "type": "object",
        "properties": {
          "model": {"type": "string", "description": "a served model id; the first model when absent"},
          "max_tokens": {"type": "integer", "minimum": 0, "description": "0 only with completions' echo"},
          "max_completion_tokens": {"type": "integer", "minimum": 1},
          "temperature": {"type": "number", "minimum": 0, "maximum": 2, "default": 1, "description": "0: greedy"},
          "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1, "default": 1},
          "top_k": {"type": "integer", "minimum": 0, "default": 0},
          "min_p": {"type": "number", "minimum": 0, "maximum": 1, "default": 0},
          "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2, "default": 0},
          "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2, "default": 0},
          "repetition_penalty": {"type": "number", "default": 1},
          "seed": {"type": "integer"},
          "stop": {"$ref": "#/components/schemas/Stop"},
          "stream": {"type": "boolean", "default": false},
          "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
          "n": {"type": "integer", "minimum": 1, "maximum": 16, "default": 1, "description": "choices, each sampled with seed + index"},
          "ignore_eos": {"type": "boolean", "default": false, "description": "generate exactly max_tokens (benchmarks)"},
          "logit_bias": {"type": "object", "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
            "description": "token id (as a string) -> bias added to its logit; -100 bans it"},
          "user": {"type": "string", "description": "accepted, not used"}
        },
        "description": "A field not listed here is a 400 naming it (null counts as absent)."
      },
      "Usage": {"type": "object", "properties": {
        "prompt_tokens": {"type": "integer"}, "completion_tokens": {"type": "integer"}, "total_tokens": {"type": "integer"}}},
      "ChatRequest": {
        "allOf": [{"$ref": "#/components/schemas/Sampling"}, {
          "type": "object", "required": ["messages"],
          "properties": {
            "messages": {"type": "array", "items": {"type": "object", "required": ["role"], "properties": {
              "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
              "name": {"type": "string"}, "tool_call_id": {"type": "string"},
              "tool_calls": {"type": "array", "items": {"type": "object"}},
              "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object",
                "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}}]}}}},
            "logprobs": {"type": "boolean"},
            "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
            "response_format": {"type": "object", "description": "text, json_object, json_schema ({name, schema, strict}), or smelt's regex ({regex}) and grammar ({grammar}: Lark): the output is constrained to it"},
            "tools": {"type": "array", "items": {"type": "object", "description": "{type: function, function: {name, description, parameters}}"}},
            "tool_choice": {"description": "auto, none, required, or {type: function, function: {name}}; required and named calls are forced by a grammar"},
            "parallel_tool_calls": {"type": "boolean", "default": true}
          }}]
      },
      "CompletionRequest": {
        "allOf": [{"$ref": "#/components/schemas/Sampling"}, {
          "type": "object", "required": ["prompt"],
          "properties": {
            "prompt": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": 1},
              {"type": "array", "items": {"type": "integer"}}, {"type": "array", "maxItems": 1, "items": {"type": "array", "items": {"type": "integer"}}}]},
            "logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
            "echo": {"type": "boolean", "description": "answer the prompt first; with logprobs, each prompt token's (max_tokens 0: score only)"},
            "best_of": {"type": "integer", "description": "1 or n only"},
            "suffix": {"type": "string", "description": "only empty: no fill-in-the-middle"}
          }}]
      },
      "ChatCompletion": {"type": "object", "properties": {
        "id": {"type": "string"}, "object": {"const": "chat.completion"}, "created": {"type": "integer"}, "model": {"type": "string"},
        "choices": {"type": "array", "items": {"type": "object", "properties": {
          "index": {"type": "integer"},
          "message": {"type": "object", "properties": {"role": {"const": "assistant"}, "content": {"type": ["string", "null"]},
            "tool_calls": {"type": "array"}, "reasoning_content": {"type": "string"}}},
          "logprobs": {"type": ["object", "null"]},
          "finish_reason": {"enum": ["stop", "length", "tool_calls"]}}}},
        "usage": {"$ref": "#/components/schemas/Usage"}}},
      "Completion": {"type": "object", "properties": {
        "id": {"type": "string"}, "object": {"const": "text_completion"}, "created": {"type": "integer"}, "model": {"type": "string"},
        "choices": {"type": "array", "items": {"type": "object", "properties": {
          "index": {"type": "integer"}, "text": {"type": "string"}, "logprobs": {"type": ["object", "null"]},
          "finish_reason": {"enum": ["stop", "length"]}}}},
        "usage": {"$ref": "#/components/schemas/Usage"}}},
      "EmbeddingRequest": {"type": "object", "required": ["input"], "additionalProperties": false, "properties": {
        "model": {"type": "string", "description": "a served model id; the first model when absent"},
        "input": {"oneOf": [{"type": "string", "minLength": 1}, {"type": "array", "minItems": 1, "maxItems": 2048, "items": {"type": "string", "minLength": 1}},
          {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}, {"type": "array", "minItems": 1, "maxItems": 2048, "items": {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}}],
          "description": "each text (or list of token ids) is embedded on its own; at most --ctx tokens each"},
        "encoding_format": {"enum": ["float", "base64"], "default": "float", "description": "base64: little-endian f32"},
        "dimensions": {"type": "integer", "description": "only the model's own width"},
        "user": {"type": "string", "description": "accepted, not used"}}},
      "EmbeddingList": {"type": "object", "properties": {
        "object": {"const": "list"}, "model": {"type": "string"},
        "data": {"type": "array", "items": {"type": "object", "properties": {
          "object": {"const": "embedding"}, "index": {"type": "integer"},
          "embedding": {"oneOf": [{"type": "array", "items": {"type": "number"}}, {"type": "string"}]}}}},
        "usage": {"type": "object", "properties": {"prompt_tokens": {"type": "integer"}, "total_tokens": {"type": "integer"}}}}},
      "ModelList": {"type": "object", "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": {
        "type": "object", "properties": {"id": {"type": "string"}, "object": {"const": "model"}, "created": {"type": "integer"}, "owned_by": {"type": "string"}}}}}}
    },
    "responses": {
      "BadRequest": {"description": "bad JSON, bad types, out-of-range values, prompt longer than the context", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}},
      "Unauthorized": {"description": "missing or wrong API key", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}},
      "NotFound": {"description": "unknown model", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}},
      "TooMany": {"description": "the model's queue is full; see Retry-After", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}},
      "Unavailable": {"description": "shutting down, or the request cannot fit in the KV cache", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    }
  },
  "paths": {
    "/v1/chat/completions": {"post": {
      "summary": "Chat completion (JSON, or server-sent events with stream: true ending in `data: [DONE]`)",
      "security": [{"bearer": []}],
      "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ChatRequest"}}}},
      "responses": {
        "200": {"description": "the completion", "content": {
          "application/json": {"schema": {"$ref": "#/components/schemas/ChatCompletion"}},
          "text/event-stream": {"schema": {"type": "string"}}}},
        "400": {"$ref": "#/components/responses/BadRequest"}, "401": {"$ref": "#/components/responses/Unauthorized"},
        "404": {"$ref": "#/components/responses/NotFound"}, "429": {"$ref": "#/components/responses/TooMany"},
        "503": {"$ref": "#/components/responses/Unavailable"}}}},
    "/v1/embeddings": {"post": {
      "summary": "Embeddings: the hidden state pooled as the GGUF's pooling_type says (mean when unset; --pooling overrides), L2-normalized",
      "security": [{"bearer": []}],
      "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/EmbeddingRequest"}}}},
      "responses": {
        "200": {"description": "one embedding per input, in order", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/EmbeddingList"}}}},
        "400": {"$ref": "#/components/responses/BadRequest"}, "401": {"$ref": "#/components/responses/Unauthorized"},
        "404": {"$ref": "#/components/responses/NotFound"}, "503": {"$ref": "#/components/responses/Unavailable"}}}},
    "/v1/completions": {"post": {
      "summary": "Text completion (JSON, or server-sent events with stream: true)",
      "security": [{"bearer": []}],
      "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/CompletionRequest"}}}},
      "responses": {
        "200": {"description": "the completion", "content": {
          "application/json": {"schema": {"$ref": "#/components/schemas/Completion"}},
          "text/event-stream": {"schema": {"type": "string"}}}},
        "400": {"$ref": "#/components/responses/BadRequest"}, "401": {"$ref": "#/components/responses/Unauthorized"},
        "404": {"$ref": "#/components/responses/NotFound"}, "429": {"$ref": "#/components/responses/TooMany"},
        "503": {"$ref": "#/components/responses/Unavailable"}}}},
    "/v1/models": {"get": {"summary": "The served models", "security": [{"bearer": []}],
      "responses": {"200": {"description": "list", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ModelList"}}}},
        "401": {"$ref": "#/components/responses/Unauthorized"}}}},
    "/v1/models/{id}": {"get": {"summary": "One served model", "security": [{"bearer": []}],
      "parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}],
      "responses": {"200": {"description": "the model"}, "404": {"$ref": "#/components/responses/NotFound"}}}},
    "/tokenize": {"post": {"summary": "vLLM's: a prompt's token ids (special-token text parsed; add_special_tokens adds BOS as the GGUF says)",
      "security": [{"bearer": []}],
      "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object", "required": ["prompt"],
        "additionalProperties": false, "properties": {"model": {"type": "string"}, "prompt": {"type": "string"},
        "add_special_tokens": {"type": "boolean"}, "return_token_strs": {"type": "boolean"}}}}}},
      "responses": {"200": {"description": "{tokens, count, max_model_len}"}, "400": {"$ref": "#/components/responses/BadRequest"},
        "401": {"$ref": "#/components/responses/Unauthorized"}, "404": {"$ref": "#/components/responses/NotFound"}}}},
    "/detokenize": {"post": {"summary": "vLLM's: the text of token ids (control tokens as their text)",
      "security": [{"bearer": []}],
      "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object", "required": ["tokens"],
        "additionalProperties": false, "properties": {"model": {"type": "string"},
        "tokens": {"type": "array", "items": {"type": "integer", "minimum": 0}}}}}}},
      "responses": {"200": {"description": "{prompt}"}, "400": {"$ref": "#/components/responses/BadRequest"},
        "401": {"$ref": "#/components/responses/Unauthorized"}, "404": {"$ref": "#/components/responses/NotFound"}}}},
    "/tokenizer_info": {"get": {"summary": "vLLM's: BOS/EOS text, chat template and context length of a model",
      "security": [{"bearer": []}],
      "parameters": [{"name": "model", "in": "query", "required": false, "schema": {"type": "string"}}],
      "responses": {"200": {"description": "tokenizer facts"}, "401": {"$ref": "#/components/responses/Unauthorized"},
        "404": {"$ref": "#/components/responses/NotFound"}}}},
    "/health": {"get": {"summary": "Readiness: 200 with the model ids while a model can serve; 503 with no model loaded or while shutting down",
      "responses": {"200": {"description": "serving"}, "503": {"description": "no model, or shutting down"}}}},
    "/live": {"get": {"summary": "Liveness: 200 while the process answers, whatever its models",
      "responses": {"200": {"description": "alive"}}}},
    "/metrics": {"get": {"summary": "Prometheus text: requests by status, prompt/generated tokens, time to first token and inter-token latency histograms, queue depth, running sequences, KV blocks used/free",
      "responses": {"200": {"description": "metrics", "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
    "/openapi.json": {"get": {"summary": "This description", "responses": {"200": {"description": "OpenAPI 3.1"}}}},
    "/admin/models": {
      "get": {"summary": "Loaded models with their paths, context and load", "security": [{"bearer": []}],
        "responses": {"200": {"description": "list"}, "401": {"$ref": "#/components/responses/Unauthorized"}}},
      "post": {"summary": "Load {\"model\": path-or-alias, \"id\"?: string, \"expect_loaded\"?: [id]} or unload {\"action\": \"unload\", \"id\": string}",
        "security": [{"bearer": []}],
        "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object", "properties": {
          "action": {"enum": ["load", "unload"]}, "model": {"type": "string"}, "id": {"type": "string"},
          "expect_loaded": {"type": "array", "items": {"type": "string"}}}}}}},
        "responses": {"200": {"description": "{\"loaded\": model} or {\"unloaded\": id}"},
          "400": {"$ref": "#/components/responses/BadRequest"}, "401": {"$ref": "#/components/responses/Unauthorized"},
          "403": {"description": "admin disabled, or a model outside --models-dir and the aliases"},
          "404": {"$ref": "#/components/responses/NotFound"},
          "409": {"description": "the models' memory limit would be exceeded, or the server holds a model outside expect_loaded (models_changed)"}}}},
    "/": {"get": {"summary": "The chat page (embedded static files: /, /app.js, /style.css)",
      "responses": {"200": {"description": "HTML", "content": {"text/html": {"schema": {"type": "string"}}}}}}}
  }
}"##;

#[cfg(test)]
mod tests {
    #[test]
    fn spec_is_json_and_names_every_route() {
        let v: serde_json::Value = serde_json::from_str(super::SPEC).expect("valid JSON");
        let paths = v["paths"].as_object().expect("paths");
        for p in [
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/embeddings",
            "/v1/models",
            "/v1/models/{id}",
            "/tokenize",
            "/detokenize",
            "/tokenizer_info",
            "/health",
            "/live",
            "/metrics",
            "/openapi.json",
            "/admin/models",
            "/",
        ] {
            assert!(paths.contains_key(p), "{p} missing");
        }
    }
}
