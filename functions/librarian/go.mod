module github.com/conclave-ai/conclave/functions/librarian

go 1.26.8
