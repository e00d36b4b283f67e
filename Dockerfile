# syntax=docker/dockerfile:1
#
# fenced and the ledger example, built from this repository.
#
#   docker build --target fenced -t fenced .
#   docker run --rm -p 7070:7070 fenced            # fenced dev: nothing else needed
#   docker compose up                              # the whole system (docker-compose.yml)

FROM golang:1.26-alpine AS build
WORKDIR /src
ENV CGO_ENABLED=0
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=docker
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/fenced ./cmd/fenced

FROM build AS build-ledger
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath -ldflags "-s -w" -o /out/ledger ./examples/ledger

# Alpine rather than distroless: its busybox wget serves the health checks.
FROM alpine:3.22 AS fenced
RUN adduser -D -H -u 10001 fenced
COPY --from=build /out/fenced /usr/local/bin/fenced
USER fenced
# Inside a container, listen on every interface (a flag still overrides it).
ENV FENCED_LISTEN=0.0.0.0:7070
EXPOSE 7070
HEALTHCHECK --interval=5s --timeout=3s --start-period=10s --retries=5 \
    CMD wget -q -O /dev/null http://127.0.0.1:7070/readyz || exit 1
ENTRYPOINT ["/usr/local/bin/fenced"]
CMD ["dev"]

FROM alpine:3.22 AS ledger
RUN adduser -D -H -u 10001 ledger
COPY --from=build-ledger /out/ledger /usr/local/bin/ledger
USER ledger
ENTRYPOINT ["/usr/local/bin/ledger"]
