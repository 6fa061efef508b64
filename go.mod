module github.com/weftlm/weft

go 1.26
