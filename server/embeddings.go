package server

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"

	"github.com/weftlm/weft"
)

// maxEmbedInputs is OpenAI's limit on inputs per embeddings request.
const maxEmbedInputs = 2048

type embeddingRequest struct {
	Model          string          `json:"model"`
	Input          json.RawMessage `json:"input"`
	EncodingFormat string          `json:"encoding_format"`
	Dimensions     *int            `json:"dimensions"`
}

type embeddingList struct {
	Object string      `json:"object"`
	Data   []embedding `json:"data"`
	Model  string      `json:"model"`
	Usage  struct {
		PromptTokens int `json:"prompt_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
}

type embedding struct {
	Object    string `json:"object"`
	Index     int    `json:"index"`
	Embedding any    `json:"embedding"` // []float32, or a base64 string of little-endian float32s
}

// inputs reads input: a string or a non-empty array of strings.
func (e *embeddingRequest) inputs() ([]string, error) {
	raw := bytes.TrimSpace(e.Input)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badRequest("input", "input is required: a string or an array of strings")
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return []string{one}, nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err != nil || len(many) == 0 {
		return nil, badRequest("input", "input: want a string or a non-empty array of strings (token-id input is not supported)")
	}
	if len(many) > maxEmbedInputs {
		return nil, badRequest("input", "input has %d entries; at most %d are allowed", len(many), maxEmbedInputs)
	}
	return many, nil
}

// embeddings serves POST /v1/embeddings: the mean of each text's final
// hidden states, scaled to unit length (OpenAI's embeddings are
// normalised too). dimensions keeps the first components and normalises
// again.
func (s *Server) embeddings(w http.ResponseWriter, r *http.Request, rec *record) error {
	var req embeddingRequest
	if err := readJSON(r, &req); err != nil {
		return err
	}
	texts, err := req.inputs()
	if err != nil {
		return err
	}
	b64 := false
	switch req.EncodingFormat {
	case "", "float":
	case "base64":
		b64 = true
	default:
		return badRequest("encoding_format", "encoding_format %q: want \"float\" or \"base64\"", req.EncodingFormat)
	}
	dim := s.info.Config.Dim
	if req.Dimensions != nil {
		if d := *req.Dimensions; d < 1 || d > dim {
			return badRequest("dimensions", "dimensions = %d: this model's embeddings have %d, want 1 to %d", d, dim, dim)
		}
		dim = *req.Dimensions
	}
	for i, t := range texts {
		ids, err := s.m.PromptTokens(t)
		if err != nil {
			return err
		}
		// Embedding needs no room to generate: the whole context may hold
		// the text.
		if len(ids) > s.info.Context {
			return promptTooLong(fmt.Sprintf("input[%d]", i), len(ids), s.info.Context)
		}
		rec.promptTokens += len(ids)
	}
	release, err := s.gate.enter(r.Context())
	if err != nil {
		return err
	}
	vecs, err := s.m.Embed(r.Context(), texts, weft.WithPooling(weft.PoolMean), weft.WithNormalize(true))
	release()
	if err != nil {
		return err
	}
	resp := embeddingList{Object: "list", Model: s.opts.ModelID, Data: make([]embedding, len(vecs))}
	resp.Usage.PromptTokens, resp.Usage.TotalTokens = rec.promptTokens, rec.promptTokens
	for i, v := range vecs {
		if dim < len(v) {
			v = normalize(v[:dim])
		}
		e := embedding{Object: "embedding", Index: i, Embedding: v}
		if b64 {
			buf := make([]byte, 4*len(v))
			for k, x := range v {
				binary.LittleEndian.PutUint32(buf[4*k:], math.Float32bits(x))
			}
			e.Embedding = base64.StdEncoding.EncodeToString(buf)
		}
		resp.Data[i] = e
	}
	return writeJSON(w, http.StatusOK, resp)
}

func normalize(v []float32) []float32 {
	var ss float64
	for _, x := range v {
		ss += float64(x) * float64(x)
	}
	if ss > 0 {
		inv := float32(1 / math.Sqrt(ss))
		for i := range v {
			v[i] *= inv
		}
	}
	return v
}

type modelEntry struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

func (s *Server) entry() modelEntry {
	return modelEntry{ID: s.opts.ModelID, Object: "model", Created: s.created, OwnedBy: "weft"}
}

// models serves GET /v1/models: the one model.
func (s *Server) models(w http.ResponseWriter, r *http.Request, rec *record) error {
	return writeJSON(w, http.StatusOK, struct {
		Object string       `json:"object"`
		Data   []modelEntry `json:"data"`
	}{"list", []modelEntry{s.entry()}})
}

// model serves GET /v1/models/{id}.
func (s *Server) model(w http.ResponseWriter, r *http.Request, rec *record) error {
	id := strings.TrimPrefix(r.URL.Path, "/v1/models/")
	if id != s.opts.ModelID {
		return &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "model", Code: "model_not_found",
			Message: fmt.Sprintf("the model %q does not exist; this server has %q", id, s.opts.ModelID)}
	}
	return writeJSON(w, http.StatusOK, s.entry())
}

// health serves GET /health: 200 while serving, 503 while shutting down.
func (s *Server) health(w http.ResponseWriter, r *http.Request, rec *record) error {
	active, waiting := s.gate.depth()
	status, code := "ok", http.StatusOK
	if s.gate.isClosed() {
		status, code = "shutting down", http.StatusServiceUnavailable
	}
	return writeJSON(w, code, map[string]any{"status": status, "model": s.opts.ModelID,
		"slots": cap(s.gate.slots), "active": active, "queued": waiting})
}

// writeMetrics serves GET /metrics in Prometheus's text format.
func (s *Server) writeMetrics(w http.ResponseWriter, r *http.Request, rec *record) error {
	active, waiting := s.gate.depth()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	return s.metrics.write(w, active, waiting, cap(s.gate.slots), s.m.Metrics().CachedPromptTokens)
}
