"""What both servers and the client share: TLS and roles, the authorization gate, serving, configuration,
logs, certificates, the one table of reasons and the enum words. Imports no other part of holdfast."""
