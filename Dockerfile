# The metasync image: a static binary on an empty base, non-root. The
# binary is built by Go on the build machine, not in a build stage, so
# that the build pulls nothing and works offline; build with
#   make image            # or hack/image.sh; IMAGE= names it
# which prepares the context this file expects: metasync, the CA bundle,
# passwd and group.
FROM scratch
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY passwd /etc/passwd
COPY group /etc/group
COPY metasync /metasync
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/metasync"]
CMD ["serve", "--config", "/etc/metasync/config.yaml"]
