package server

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/weftlm/weft/sample"
)

// FuzzDecode feeds any body to the request decoding of every route: it
// must never panic, every refusal must be a 400 naming what is wrong,
// and any sampling settings it accepts the sampler must accept too. The
// seed corpus, in testdata/fuzz/FuzzDecode, has a request of each route.
func FuzzDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, body []byte) {
		check := func(what string, err error) {
			if err == nil {
				return
			}
			if ae := toAPIError(err); ae.Status != http.StatusBadRequest || ae.Message == "" {
				t.Fatalf("%s: %v became %d %q", what, err, ae.Status, ae.Message)
			}
		}
		var sp sampling
		var chat chatRequest
		var comp completionRequest
		var emb embeddingRequest
		for _, d := range []any{&sp, &chat, &comp, &emb} {
			if err := json.Unmarshal(body, d); err != nil {
				check("decode", err)
				return
			}
		}
		const vocab = 512
		g, err := sp.options(vocab, 16)
		check("options", err)
		if err == nil {
			if _, err := sample.New(g.Sampling, vocab); err != nil {
				t.Fatalf("accepted settings the sampler refuses: %v", err)
			}
		}
		_, err = chat.messages()
		check("messages", err)
		_, err = chat.logprobs()
		check("chat logprobs", err)
		_, err = comp.prompts(vocab)
		check("prompts", err)
		_, err = comp.logprobs()
		check("completion logprobs", err)
		_, err = emb.inputs()
		check("inputs", err)
	})
}
