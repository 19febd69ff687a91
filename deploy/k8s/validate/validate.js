// Validates every object of rendered manifests (multi-document YAML files given as arguments)
// against the Kubernetes OpenAPI schemas, the way an API server with strict field validation
// would, without a cluster:
//  - types, formats, enums and required fields: the JSON-schema validators that the npm
//    package kubernetes-models generates from the Kubernetes OpenAPI spec;
//  - unknown fields (a misspelt key, which those validators let through): every key is looked
//    up in the field list of its type in the models of the official JavaScript client
//    (@kubernetes/client-node, also generated from the OpenAPI spec).
// An apiVersion/kind that neither knows is an error. Exit 0 when every object is valid, 1 with
// one line per problem.
"use strict";
const fs = require("fs");
const yaml = require("js-yaml");
const k8s = require("@kubernetes/client-node");

function schemaModel(apiVersion, kind) {
  // "apps/v1" -> kubernetes-models/apps/v1/Kind; core "v1" -> kubernetes-models/v1/Kind.
  if (!/^[a-z0-9.]+(\/[a-z0-9]+)?$/.test(apiVersion) || !/^[A-Za-z]+$/.test(kind)) return null;
  try {
    const mod = require(`kubernetes-models/${apiVersion}/${kind}`);
    return mod[kind] || null;
  } catch (e) {
    return null;
  }
}

// The client's class for a top-level object: "autoscaling/v2" HorizontalPodAutoscaler ->
// V2HorizontalPodAutoscaler.
function clientType(apiVersion, kind) {
  const version = apiVersion.split("/").pop();
  const name = version.charAt(0).toUpperCase() + version.slice(1) + kind;
  return k8s[name] && k8s[name].attributeTypeMap ? name : null;
}

// Reports keys that the type does not have, recursively.
function unknownFields(value, type, path, out) {
  if (value === null || typeof value !== "object") return;
  let m = /^Array<(.+)>$/.exec(type);
  if (m) {
    if (Array.isArray(value)) value.forEach((v, i) => unknownFields(v, m[1], `${path}/${i}`, out));
    return;
  }
  m = /^\{ \[key: string\]: (.+); \}$/.exec(type);
  if (m) {
    for (const [k, v] of Object.entries(value)) unknownFields(v, m[1], `${path}/${k}`, out);
    return;
  }
  const cls = k8s[type];
  if (!cls || !cls.attributeTypeMap) return; // a scalar, IntOrString, free-form object
  const fields = new Map(cls.attributeTypeMap.map((a) => [a.baseName, a.type]));
  for (const [k, v] of Object.entries(value)) {
    if (!fields.has(k)) out.push(`${path}/${k}: unknown field (not in ${type})`);
    else unknownFields(v, fields.get(k), `${path}/${k}`, out);
  }
}

let problems = 0, objects = 0;
for (const file of process.argv.slice(2)) {
  const docs = yaml.loadAll(fs.readFileSync(file, "utf8")).filter((d) => d != null);
  for (const doc of docs) {
    objects++;
    const where = `${file}: ${doc.kind || "?"} ${(doc.metadata && doc.metadata.name) || "?"}`;
    const Model = schemaModel(String(doc.apiVersion), String(doc.kind));
    const type = clientType(String(doc.apiVersion), String(doc.kind));
    if (!Model || !type) {
      console.log(`${where}: no schema for apiVersion ${doc.apiVersion} kind ${doc.kind}`);
      problems++;
      continue;
    }
    const found = [];
    try {
      new Model(doc).validate();
    } catch (e) {
      for (const x of e.errors || [{ instancePath: "", message: e.message }])
        found.push(`${x.instancePath || "/"}: ${x.message}`);
    }
    unknownFields(doc, type, "", found);
    for (const f of found) console.log(`${where}: ${f}`);
    if (found.length) problems++;
  }
}
console.log(`${objects} objects checked, ${problems} invalid`);
process.exit(problems || objects === 0 ? 1 : 0);
