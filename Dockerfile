# A static metasync binary on an empty, non-root runtime image.
#   docker build -t metasync:latest --build-arg VERSION=$(git describe --always) .
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/metasync ./cmd/metasync \
 && echo 'nonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin' > /out/passwd

FROM scratch
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/passwd /etc/passwd
COPY --from=build /out/metasync /metasync
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/metasync"]
CMD ["serve", "--config", "/etc/metasync/config.yaml"]
