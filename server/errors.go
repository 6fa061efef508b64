package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"

	"github.com/weftlm/weft"
)

// apiError is an error the client sees, in OpenAI's shape:
//
//	{"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens", "code": null}}
type apiError struct {
	Status  int
	Message string
	Type    string // invalid_request_error, authentication_error, rate_limit_error, server_error
	Param   string // the request field at fault; empty is null
	Code    string // a machine-readable reason; empty is null
}

func (e *apiError) Error() string { return e.Message }

// body is the JSON the client receives.
func (e *apiError) body() any {
	type detail struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	}
	d := detail{Message: e.Message, Type: e.Type}
	if e.Param != "" {
		d.Param = &e.Param
	}
	if e.Code != "" {
		d.Code = &e.Code
	}
	return struct {
		Error detail `json:"error"`
	}{d}
}

// badRequest is a 400 naming the field at fault.
func badRequest(param, format string, args ...any) *apiError {
	return &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: param, Message: fmt.Sprintf(format, args...)}
}

var (
	errQueueFull = &apiError{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "queue_full",
		Message: "the server is busy: every slot is running and the queue of waiting requests is full; retry later"}
	errShuttingDown = &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "shutting_down",
		Message: "the server is shutting down"}
	errUnauthorized = &apiError{Status: http.StatusUnauthorized, Type: "authentication_error", Code: "invalid_api_key",
		Message: "missing or incorrect API key: send the header \"Authorization: Bearer KEY\" with the key the server was started with"}
)

// promptTooLong is OpenAI's context_length_exceeded, naming both sizes.
func promptTooLong(param string, tokens, context int) *apiError {
	e := badRequest(param, "the prompt is %d tokens but the model's context holds %d; shorten the prompt or start the server with a larger --ctx", tokens, context)
	e.Code = "context_length_exceeded"
	return e
}

// toAPIError turns any error from decoding or from the model into what the
// client sees. Errors that are not the client's fault are 500s.
func toAPIError(err error) *apiError {
	var ae *apiError
	var tooLong *weft.PromptTooLongError
	var maxBytes *http.MaxBytesError
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.As(err, &maxBytes):
		return &apiError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "request_too_large",
			Message: fmt.Sprintf("the request body is over the server's limit of %d bytes", maxBytes.Limit)}
	case errors.As(err, &tooLong):
		return promptTooLong("", tooLong.Tokens, tooLong.Context)
	case errors.As(err, &syntax):
		return badRequest("", "the request body is not valid JSON: %v (at byte %d)", syntax, syntax.Offset)
	case errors.As(err, &typ):
		if typ.Field == "" {
			return badRequest("", "the request body must be a JSON object, not %s", typ.Value)
		}
		return badRequest(typ.Field, "%s: want %s, got %s", typ.Field, jsonKind(typ.Type), typ.Value)
	case errors.Is(err, weft.ErrNoChatTemplate):
		return badRequest("messages", "this model has no chat template, so it cannot chat; use /v1/completions with a prompt you format yourself")
	case errors.Is(err, weft.ErrNoTokenizer):
		return badRequest("", "this model has no tokenizer, so it cannot take text")
	case errors.Is(err, weft.ErrClosed):
		return errShuttingDown
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		// Only a client that has gone sees this; 499 is the usual log code.
		return &apiError{Status: 499, Type: "invalid_request_error", Code: "cancelled", Message: "the request was cancelled"}
	}
	return &apiError{Status: http.StatusInternalServerError, Type: "server_error", Message: err.Error()}
}

// jsonKind names the JSON value a Go type takes.
func jsonKind(t reflect.Type) string {
	if t == nil {
		return "a value"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return "a " + t.String()
}
