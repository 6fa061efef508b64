package weft_test

import (
	"context"
	"fmt"
	"log"

	"github.com/weftlm/weft"
)

// The model used by these examples is the small story model of the shared
// test data; any GGUF file, safetensors directory or cached model name works.
const modelPath = "../shared/testdata/gguf-stories260K/stories260K.gguf"

func Example() {
	ctx := context.Background()
	m, err := weft.Load(ctx, modelPath, weft.WithContext(512))
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	for tok, err := range m.Generate(ctx, "Once upon a time", weft.WithTemperature(0), weft.WithMaxTokens(32)) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Print(tok.Text)
	}
	fmt.Println()
}

func ExampleModel_Chat() {
	ctx := context.Background()
	m, err := weft.Load(ctx, modelPath)
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	msgs := []weft.Message{
		{Role: "system", Content: "You tell short stories."},
		{Role: "user", Content: "Tell me about a cat."},
	}
	for tok, err := range m.Chat(ctx, msgs, weft.WithMaxTokens(64), weft.WithStop("\n\n")) {
		if err != nil {
			log.Fatal(err) // weft.ErrNoChatTemplate for models without one
		}
		fmt.Print(tok.Text)
	}
}

func ExampleModel_BatchGenerate() {
	ctx := context.Background()
	m, err := weft.Load(ctx, modelPath, weft.WithParallel(4))
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	out, err := m.BatchGenerate(ctx, []string{"The cat", "The dog", "The bird"}, weft.WithTemperature(0), weft.WithMaxTokens(16))
	if err != nil {
		log.Fatal(err)
	}
	for _, c := range out {
		fmt.Printf("%q (%s)\n", c.Text, c.FinishReason)
	}
}

func ExampleModel_Embed() {
	ctx := context.Background()
	m, err := weft.Load(ctx, modelPath)
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	vecs, err := m.Embed(ctx, []string{"a happy dog", "a sad cat"}, weft.WithPooling(weft.PoolMean), weft.WithNormalize(true))
	if err != nil {
		log.Fatal(err)
	}
	var cos float32
	for i := range vecs[0] {
		cos += vecs[0][i] * vecs[1][i]
	}
	fmt.Printf("cosine similarity %.3f\n", cos)
}

func ExampleModel_Metrics() {
	ctx := context.Background()
	m, err := weft.Load(ctx, modelPath)
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	for _, err := range m.Generate(ctx, "Lily", weft.WithMaxTokens(20), weft.WithSeed(1)) {
		if err != nil {
			log.Fatal(err)
		}
	}
	mt := m.Metrics()
	fmt.Printf("%d tokens at %.0f tok/s, first after %s\n", mt.LastGeneratedTokens, mt.DecodeTokensPerSec, mt.TimeToFirstToken)
}
