# Serve a model on the CPU and on the GPU (exact kernels on both, so the
# logits are bit-identical), ask each for the same completions
# (/v1/completions with logprobs: greedy, top-p, presence and frequency
# penalties), and compare: the same tokens, log-probabilities within
# 2e-6 + 1e-6 relative (the GPU sums the log-sum-exp in another order).
# On the device, beside a weft binary built here:
#   python3 lpserve.py stories260K.gguf
import json, subprocess, sys, time, urllib.request, os
model = sys.argv[1]
def serve(backend, port):
    env = dict(os.environ, WEFT_CUDA_EXACT="1", WEFT_CPU_KERNELS="exact")
    return subprocess.Popen(["./weft", "serve", "-m", model, "--backend", backend, "--addr", f"127.0.0.1:{port}"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
def ask(port, body):
    for _ in range(200):
        try:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            return json.load(urllib.request.urlopen(req, timeout=60))
        except urllib.error.URLError:
            time.sleep(0.5)
    raise SystemExit("no server on %d" % port)
procs = [serve("cpu", 18081), serve("cuda", 18082)]
try:
    bad = 0
    for body in [{"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0.8, "top_p": 0.95, "seed": 3, "logprobs": 5},
                 {"prompt": "One day", "max_tokens": 40, "temperature": 0, "logprobs": 0},
                 {"prompt": "The cat", "max_tokens": 40, "temperature": 1.0, "seed": 9, "logprobs": 3, "presence_penalty": 1.5, "frequency_penalty": 0.5}]:
        a, b = ask(18081, body), ask(18082, body)
        la, lb = a["choices"][0]["logprobs"], b["choices"][0]["logprobs"]
        if la["tokens"] != lb["tokens"]:
            print("tokens differ:", la["tokens"], lb["tokens"]); bad += 1; continue
        worst = 0.0
        for x, y in zip(la["token_logprobs"], lb["token_logprobs"]):
            worst = max(worst, abs(x - y) / (2e-6 + 1e-6 * abs(x)))
        for ta, tb in zip(la["top_logprobs"] or [], lb["top_logprobs"] or []):
            if list(ta) != list(tb):
                print("top tokens differ:", ta, tb); bad += 1
            for k in ta:
                worst = max(worst, abs(ta[k] - tb.get(k, 1e9)) / (2e-6 + 1e-6 * abs(ta[k])))
        print(f"{len(la['tokens'])} tokens, text {b['choices'][0]['text'][:40]!r}, worst error {worst:.3f} of the tolerance")
        bad += worst > 1
    print("lpserve:", "FAIL" if bad else "ok")
finally:
    for p in procs:
        p.terminate()
    for p in procs:
        _, err = p.communicate(timeout=30)
        if err:
            print(err.decode()[-600:])
