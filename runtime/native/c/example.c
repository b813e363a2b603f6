// Load mha.onnx with the ONNX Runtime C API and run one input (batch 1, 4 tokens, d_in 3: the seed preset).
#include <stdio.h>
#include <onnxruntime_c_api.h>

int main(int argc, char **argv) {
    const OrtApi *ort = OrtGetApiBase()->GetApi(ORT_API_VERSION);
    OrtEnv *env; OrtSessionOptions *opts; OrtSession *session; OrtMemoryInfo *cpu;
    OrtValue *x = NULL, *context = NULL;
    float input[1 * 4 * 3] = {0.43f, 0.15f, 0.89f, 0.55f, 0.87f, 0.66f, 0.57f, 0.85f, 0.64f, 0.22f, 0.58f, 0.33f};
    int64_t shape[3] = {1, 4, 3};
    const char *in_names[] = {"x"}, *out_names[] = {"context"};
    OrtStatus *st = ort->CreateEnv(ORT_LOGGING_LEVEL_WARNING, "example", &env);
    if (!st) st = ort->CreateSessionOptions(&opts);
    if (!st) st = ort->CreateSession(env, argc > 1 ? argv[1] : "artifacts/seed/mha.onnx", opts, &session);
    if (!st) st = ort->CreateCpuMemoryInfo(OrtArenaAllocator, OrtMemTypeDefault, &cpu);
    if (!st) st = ort->CreateTensorWithDataAsOrtValue(cpu, input, sizeof input, shape, 3,
                                                      ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &x);
    if (!st) st = ort->Run(session, NULL, in_names, (const OrtValue *const *)&x, 1, out_names, 1, &context);
    float *y;
    if (!st) st = ort->GetTensorMutableData(context, (void **)&y);
    if (st) { fprintf(stderr, "error: %s\n", ort->GetErrorMessage(st)); return 1; }
    printf("context[0, 0, :4] = %.4f %.4f %.4f %.4f\n", y[0], y[1], y[2], y[3]);  /* -0.4519 0.2216 ... */
    return 0;
}
