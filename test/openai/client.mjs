// Drives weft serve with OpenAI's official Node client and checks what
// comes back. Usage: node client.mjs BASE_URL
//
// The Go test that starts the server (server/node_test.go) passes, in the
// environment, the API key (WEFT_API_KEY) and the texts the model itself
// produced for the same greedy requests (WEFT_EXPECT, JSON), so the checks
// are on content, not only on shape.
import assert from "node:assert/strict";
import OpenAI from "openai";

const base = process.argv[2];
if (!base) {
  console.error("usage: node client.mjs BASE_URL");
  process.exit(2);
}
const expect = JSON.parse(process.env.WEFT_EXPECT ?? "{}");
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: process.env.WEFT_API_KEY ?? "none", maxRetries: 0 });
let checks = 0;
const check = async (name, f) => {
  await f();
  checks++;
  console.log(`ok ${name}`);
};

// Expects f to fail with an API error of the given status and returns it.
async function apiError(status, f) {
  try {
    await f();
  } catch (err) {
    assert.ok(err instanceof OpenAI.APIError, `want an APIError, got ${err}`);
    assert.equal(err.status, status, err.message);
    return err;
  }
  assert.fail(`want an error with status ${status}, got success`);
}

let model;
await check("models list", async () => {
  const list = await client.models.list();
  assert.equal(list.data.length, 1);
  model = list.data[0].id;
  assert.equal(model, expect.model);
  assert.equal(list.data[0].object, "model");
  assert.equal(list.data[0].owned_by, "weft");
  const one = await client.models.retrieve(model);
  assert.equal(one.id, model);
});

await check("completion", async () => {
  const c = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 24, temperature: 0 });
  assert.equal(c.object, "text_completion");
  assert.equal(c.model, model);
  assert.equal(c.choices.length, 1);
  assert.equal(c.choices[0].text, expect.completion);
  assert.equal(c.choices[0].finish_reason, "length");
  assert.equal(c.usage.completion_tokens, 24);
  assert.equal(c.usage.prompt_tokens, expect.completionPromptTokens);
  assert.equal(c.usage.total_tokens, c.usage.prompt_tokens + 24);
});

await check("streaming completion", async () => {
  const stream = await client.completions.create({
    model, prompt: "Once upon a time", max_tokens: 24, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  });
  let text = "", finish = null, usage = null, chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    assert.equal(chunk.object, "text_completion");
    if (chunk.usage) usage = chunk.usage;
    for (const ch of chunk.choices) {
      text += ch.text;
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  assert.ok(chunks > 2, `only ${chunks} chunks`);
  assert.equal(text, expect.completion);
  assert.equal(finish, "length");
  assert.equal(usage?.completion_tokens, 24);
});

await check("embeddings", async () => {
  // The client asks for base64 and decodes it unless told otherwise.
  const e = await client.embeddings.create({ model, input: ["Once upon a time", "The cat sat"] });
  assert.equal(e.object, "list");
  assert.equal(e.data.length, 2);
  assert.ok(e.usage.prompt_tokens > 2);
  const f = await client.embeddings.create({ model, input: "Once upon a time", encoding_format: "float" });
  for (const d of [...e.data, ...f.data]) {
    assert.equal(d.embedding.length, expect.dim);
    const norm = Math.hypot(...d.embedding);
    assert.ok(Math.abs(norm - 1) < 1e-4, `norm ${norm}`);
  }
  f.data[0].embedding.forEach((x, i) => assert.ok(Math.abs(x - e.data[0].embedding[i]) < 1e-6));
  assert.notDeepEqual(e.data[0].embedding, e.data[1].embedding);
});

await check("chat", async () => {
  const c = await client.chat.completions.create({
    model, messages: [{ role: "user", content: "Tell me a story" }], max_tokens: 24, temperature: 0,
  });
  assert.equal(c.object, "chat.completion");
  assert.equal(c.choices[0].message.role, "assistant");
  assert.equal(c.choices[0].message.content, expect.chat);
  assert.equal(c.usage.prompt_tokens, expect.chatPromptTokens);
  assert.equal(c.usage.completion_tokens, 24);
});

await check("streaming chat with text parts and usage", async () => {
  const stream = await client.chat.completions.create({
    model, messages: [{ role: "user", content: [{ type: "text", text: "Tell me a story" }] }],
    max_tokens: 24, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let text = "", role = null, finish = null, usage = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, "chat.completion.chunk");
    if (chunk.usage) {
      usage = chunk.usage;
      assert.equal(chunk.choices.length, 0);
    }
    for (const ch of chunk.choices) {
      role ??= ch.delta.role;
      text += ch.delta.content ?? "";
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  assert.equal(role, "assistant");
  assert.equal(text, expect.chat);
  assert.equal(finish, "length");
  // The same conversation ran just before: all of its prompt but the last
  // token comes from the slot's cache.
  assert.deepEqual(usage, {
    prompt_tokens: expect.chatPromptTokens, completion_tokens: 24, total_tokens: expect.chatPromptTokens + 24,
    prompt_tokens_details: { cached_tokens: expect.chatPromptTokens - 1 },
  });
});

await check("errors", async () => {
  let err = await apiError(400, () => client.completions.create({ model, prompt: "Hi", n: 2 }));
  assert.ok(err instanceof OpenAI.BadRequestError);
  assert.equal(err.param, "n");
  err = await apiError(400, () => client.completions.create({ model, prompt: "once ".repeat(2000) }));
  assert.equal(err.code, "context_length_exceeded");
  assert.match(err.message, /the prompt is \d+ tokens but the model's context holds 256/);
  err = await apiError(400, () => client.chat.completions.create({
    model, messages: [{ role: "user", content: "Hi" }], response_format: { type: "json_schema", json_schema: { name: "x", schema: {} } },
  }));
  assert.equal(err.param, "response_format");
  const wrongKey = new OpenAI({ baseURL: `${base}/v1`, apiKey: "wrong", maxRetries: 0 });
  err = await apiError(401, () => wrongKey.models.list());
  assert.ok(err instanceof OpenAI.AuthenticationError);
});

await check("json mode", async () => {
  const r = await client.chat.completions.create({
    model, messages: [{ role: "user", content: "Give me JSON." }], response_format: { type: "json_object" },
    max_tokens: 400, seed: 3,
  });
  const text = r.choices[0].message.content;
  assert.ok(text.startsWith("{"), `json_object reply starts ${JSON.stringify(text.slice(0, 20))}`);
  if (r.choices[0].finish_reason === "stop") {
    assert.equal(typeof JSON.parse(text), "object");
  }
});

await check("json schema", async () => {
  const schema = {
    type: "object",
    properties: { mood: { enum: ["happy", "sad"] }, n: { type: "integer" } },
    required: ["mood", "n"], additionalProperties: false,
  };
  const r = await client.chat.completions.create({
    model, messages: [{ role: "user", content: "How are you?" }],
    response_format: { type: "json_schema", json_schema: { name: "mood", schema, strict: true } },
    max_tokens: 120, seed: 1,
  });
  const text = r.choices[0].message.content;
  assert.ok(text.startsWith("{"), `json_schema reply starts ${JSON.stringify(text.slice(0, 20))}`);
  if (r.choices[0].finish_reason === "stop") {
    const obj = JSON.parse(text);
    assert.ok(["happy", "sad"].includes(obj.mood), `mood ${obj.mood}`);
    assert.ok(Number.isInteger(obj.n), `n ${obj.n}`);
    assert.deepEqual(Object.keys(obj).sort(), ["mood", "n"]);
  }
});

await check("tool calls", async () => {
  // The reply is forced into Llama's call format by a schema, so the tiny
  // model makes a call the server reads back.
  const schema = {
    type: "object",
    properties: { name: { const: "get_weather" }, parameters: { type: "object", properties: { city: { enum: ["Paris", "Rome"] } }, required: ["city"] } },
    required: ["name", "parameters"],
  };
  const tools = [{ type: "function", function: { name: "get_weather", parameters: { type: "object", properties: { city: { type: "string" } } } } }];
  const req = {
    model, messages: [{ role: "user", content: "Weather in Paris?" }], tools,
    response_format: { type: "json_schema", json_schema: { name: "call", schema } }, max_tokens: 200, seed: 4,
  };
  const r = await client.chat.completions.create(req);
  const choice = r.choices[0];
  if (choice.finish_reason === "length") return;
  assert.equal(choice.finish_reason, "tool_calls");
  const call = choice.message.tool_calls[0];
  assert.equal(call.function.name, "get_weather");
  assert.ok(["Paris", "Rome"].includes(JSON.parse(call.function.arguments).city));
  // Streamed, the SDK's helper assembles the same call from the deltas.
  const stream = client.chat.completions.stream(req);
  const final = await stream.finalChatCompletion();
  assert.equal(final.choices[0].message.tool_calls[0].function.arguments, call.function.arguments);
});

console.log(`all ${checks} checks passed`);
