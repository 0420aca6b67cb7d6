module github.com/gpucr/gpucr

go 1.26.8
