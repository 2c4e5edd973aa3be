// Types of the Node.js entry point (node/index.mjs).
import { Ternion } from "../pkg/ternion_web.js";

export { Ternion };

/** Instantiates the wasm module (once), reading it from the package directory. */
export default function init(): Promise<unknown>;

/** A file read by byte ranges, as `Ternion.loadReader` takes it. */
export interface FileReader {
  name: string;
  size: number;
  read(start: number, end: number): Promise<Uint8Array>;
  close(): Promise<void>;
}

/** A reader over the file at `path` (one file handle; each read reads just its bytes). */
export function openFile(path: string): Promise<FileReader>;

/** Options of `load`: those of `Ternion.loadUrl` plus the WebGPU `GPU` object to use. */
export interface LoadOptions {
  backend?: "webgpu" | "cpu";
  nCtx?: number;
  maxBatch?: number;
  /** `false` keeps the shader-f16 kernel variants off (WebGPU). */
  f16?: boolean;
  /** `false` keeps the subgroup kernel variants off (WebGPU). */
  subgroups?: boolean;
  /**
   * The kernel of prompt batches' ternary linears (WebGPU): "auto" (the default) takes the
   * int8 subgroup-matrix tiles where the adapter offers `chromium-experimental-subgroup-matrix`
   * with 16×16×32 i8 matrices and 32-lane subgroups (Dawn with `allow_unsafe_apis`, Chrome
   * with `--enable-unsafe-webgpu`), else the portable tiles; "tiled" always takes the
   * portable tiles; "subgroup-matrix" takes the matrix tiles or fails where the adapter
   * lacks them.
   */
  prefill?: "auto" | "tiled" | "subgroup-matrix";
  gpu?: unknown;
}

/** Loads a GGUF model from a file path, a file: URL or an http(s) URL. */
export function load(
  model: string | URL,
  options?: LoadOptions,
  onProgress?: (phase: string, done: number, total: number) => void,
): Promise<Ternion>;
