module tidemark

go 1.26
